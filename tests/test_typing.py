"""Typed effects: the generic Effect and Continuation at run time (every
supported Python), and what mypy and pyright report on tests/typing/."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from kina_fx import Continuation, Effect, Handler, perform
from kina_fx.handlers import FORWARD

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "typing")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(HERE, "typed_example.py")
PLANTED = os.path.join(HERE, "planted_errors.py")


def test_generic_effect_works_at_run_time_and_stays_interned():
    alias = Effect[[int, str], bool]
    eff = alias("typing.runtime")
    assert eff is Effect("typing.runtime") and type(eff) is Effect
    assert Continuation[int, str] is not None
    assert eff.on(print) == (eff, print) and eff.fun(len) == (eff, len)
    h = Handler(on=[eff.on(lambda k, n, s: k.resume(len(s) == n))])
    assert h.run(lambda: perform(eff, 2, "ab")) is True
    with Handler(fun=[eff.fun(lambda n, s: FORWARD), Effect("typing.other").fun(lambda: 1)]):
        with Handler(fun=[eff.fun(lambda n, s: n > 0)]):
            assert eff(1, "x") is True


def test_typed_example_runs():
    sys.path.insert(0, HERE)
    try:
        import typed_example
    finally:
        sys.path.remove(HERE)
    assert typed_example.main() == {"result": (42, 42), "log": ["value 42"]}


def planted_lines():
    with open(PLANTED) as f:
        return {n for n, line in enumerate(f, 1) if "# planted:" in line}


def _tool(name):
    exe = os.path.join(os.path.dirname(sys.executable), name)
    return exe if os.path.exists(exe) else shutil.which(name)


def _error_lines(output, path, pattern):
    name = re.escape(os.path.basename(path))
    return {int(m.group(1)) for m in re.finditer(name + pattern, output)}


@pytest.mark.integration
def test_mypy_accepts_the_example_and_reports_every_planted_error(tmp_path):
    if _tool("mypy") is None:
        pytest.skip("mypy not installed (pip install -e '.[test]')")
    proc = subprocess.run(
        # --explicit-package-bases: the files' package is found from the working
        # directory, not by walking up the tree for __init__.py files (a stray
        # one in a parent directory would break the walk).
        [sys.executable, "-m", "mypy", "--explicit-package-bases", "--follow-imports=silent",
         "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}",
         EXAMPLE, PLANTED],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert _error_lines(out, EXAMPLE, r":(\d+): error") == set(), out
    assert _error_lines(out, PLANTED, r":(\d+): error") == planted_lines(), out


@pytest.mark.integration
def test_pyright_accepts_the_example_and_reports_every_planted_error():
    pyright = _tool("pyright")
    if pyright is None:
        pytest.skip("pyright not installed (pip install -e '.[test]')")
    proc = subprocess.run(
        [pyright, "--pythonpath", sys.executable, EXAMPLE, PLANTED],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert "error: Import" not in out, out
    assert _error_lines(out, EXAMPLE, r":(\d+):\d+ - error") == set(), out
    assert _error_lines(out, PLANTED, r":(\d+):\d+ - error") == planted_lines(), out
