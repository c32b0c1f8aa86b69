"""benches/bench_nested_handlers.py measures what docs/effects.md says it does:
N handlers alive at once, one inside the other (not evenodd's N/2)."""
import json
import os
import subprocess
import sys

from support.abi import load_module

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "benches", "bench_nested_handlers.py")


def test_the_nest_is_n_handlers_deep():
    # In a fresh process, as the benchmark runs it: the growth of RSS is only
    # positive where no memory freed by earlier tests is there to reuse.
    out = subprocess.run([sys.executable, BENCH, "--child", "3000"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr   # the child asserts 3000 handlers around its bottom
    result = json.loads(out.stdout)
    assert result["seconds"] > 0 and result["rss_growth_mb"] > 0


def test_evenodd_installs_a_handler_every_other_level():
    """Why the old figure was wrong: evenodd(n) is n/2 handlers deep."""
    from kina_fx import Effect, Handler

    bench = load_module(BENCH, "bench_nested_handlers")
    E, depth = Effect("bench.evenodd"), []

    def even(n):
        if n == 0:
            depth.append(bench.handlers_around_here())
            return True
        return Handler(on={E: lambda k: None}).run(odd, n - 1)

    def odd(n):
        return False if n == 0 else even(n - 1)

    assert even(2_000) is True and depth == [1_000]
