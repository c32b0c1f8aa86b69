"""A short run of each libFuzzer target of fuzz/ (docs/abi.md, "Fuzzing").

Each target checks the documented contract on every input and aborts on the
first broken promise; this test builds both with clang-19 and runs each for
KINA_FUZZ_SECONDS (default 60) from an empty corpus.  A run must end without
a crash and must have reached the paths that matter (successful calls of
every op of the runtime op table, each against its reference; the check-order
rule, validation before any read, copy or allocation; fibers that suspend and
finish; pushes that must be refused), or it checked too little (a run shorter
than 30 s only has to hold).  Longer runs: the commands in docs/abi.md.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support.abi import load_module

from kina_fx.runtime_ops import RUNTIME_OPS

ROOT = Path(__file__).resolve().parents[2]
fuzz_build = load_module(ROOT / "fuzz" / "build.py", "fuzz_build")
gen_exports = load_module(ROOT / "fuzz" / "gen_exports.py", "fuzz_gen_exports")

pytestmark = pytest.mark.integration
SECONDS = int(os.environ.get("KINA_FUZZ_SECONDS", "60"))
#: How many successful calls of each export with a reference a run of 30 s or
#: more must reach (how many it does varies tenfold with the corpus and the load).
REACHED = max(1, SECONDS // 6)


def libfuzzer_available() -> bool:
    cc = fuzz_build.clang()
    if cc is None:
        return False
    probe = subprocess.run([cc, "-print-file-name=libclang_rt.fuzzer-x86_64.a"], capture_output=True, text=True)
    return probe.returncode == 0 and Path(probe.stdout.strip()).is_file()


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    if not libfuzzer_available():
        pytest.skip("clang-19 with libFuzzer (libclang-rt-19-dev) is not installed")
    return fuzz_build.build(tmp_path_factory.mktemp("fuzz"))


def run(exe: Path, tmp_path: Path) -> str:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    env = fuzz_build.environment()
    env["KINA_FUZZ_STATS"] = "1"
    result = subprocess.run([str(exe), f"-max_total_time={SECONDS}", "-rss_limit_mb=4096",
                             f"-artifact_prefix={tmp_path}/", str(corpus)],
                            capture_output=True, text=True, env=env, timeout=SECONDS + 240, cwd=tmp_path)
    text = result.stdout + result.stderr
    broken = [line for line in text.splitlines() if "CONTRACT BROKEN" in line or "ERROR:" in line]
    assert result.returncode == 0 and not broken, "\n".join(broken) + "\n" + text[-4000:]
    assert re.search(r"Done \d+ runs", text), text[-2000:]
    return text


def test_fuzz_memref_exports(targets, tmp_path):
    text = run(targets["fuzz_memref"], tmp_path)
    counts = {m.group(1): [int(x) for x in re.findall(r" \d:(\d+)", m.group(2))]
              for m in re.finditer(r"^(\S+)\s+((?: \d:\d+)+)$", text, re.M)}
    exports = [name for name, _py, _params in fuzz_build_exports()]
    for name in exports:
        assert name in counts and sum(counts[name]) > 0, f"{name} was never called"
        assert counts[name][5] == 0, f"{name}: status 5 (a bug) {counts[name]}"
    if SECONDS < 30:
        return      # a short run proves the target builds and holds; reaching takes longer
    for name in ("copy_to_host_f32", "copy_to_device_f32", "copy_to_device_f16", "matmul_f32",
                 "gather_f32", "gpu_softmax_f32", "repeat_interleave_f32", "alloc_unranked"):
        (full,) = [n for n in counts if n.endswith(name)]
        assert counts[full][0] >= REACHED, f"{full} rarely succeeded: {counts[full]}"
        assert counts[full][5] == 0
    # every op of the table has a shape rule (it succeeds, and its reference is checked)
    for op in RUNTIME_OPS:
        assert counts[op.export][0] > 0 and counts[op.export][5] == 0, f"{op.export}: {counts[op.export]}"
    # the check-order rule was applied, with small and with 2^40-element operands
    checked = dict(re.findall(r"^check-order (small|huge) (\d+)$", text, re.M))
    assert int(checked["small"]) >= REACHED and int(checked["huge"]) >= REACHED, checked


def test_fuzz_effects(targets, tmp_path):
    text = run(targets["fuzz_effects"], tmp_path)
    if SECONDS < 30:
        return      # a short run proves the target builds and holds; reaching takes longer
    reached = {m.group(1).strip(): int(m.group(2)) for m in re.finditer(r"^([a-z -]+?)\s+(\d+)$", text, re.M)}
    for what in ("created", "suspended", "done", "cancelled", "stale-checked", "root performs",
                 "refused pushes"):
        # at least one a second: a loaded machine (CI runs two test passes at
        # once) reaches the rarest, "suspended", a few times a second
        assert reached.get(what, 0) >= SECONDS, f"the effects fuzzer rarely reached {what!r}: {reached}"


def fuzz_build_exports():
    return [(name, None, None) for name, _params in gen_exports.rows()]


def test_the_fuzzer_table_has_every_memref_export():
    """fuzz/gen_exports.py fuzzes what the library exports: every memref
    export of the tables, no more, no less."""
    native = gen_exports.native_build()
    memref_exports = {name for name, _py, params in native.exports()
                      if name.startswith(("_mlir_ciface_runtime_", "runtime_"))}
    assert {name for name, _params in gen_exports.rows()} == memref_exports
