"""The autograd benchmark script runs (3 rounds) and its baselines compute the same thing."""
import os

import numpy as np
from support.abi import load_module

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_bench():
    return load_module(os.path.join(HERE, "..", "..", "benches", "bench_autograd.py"), "bench_autograd")


def test_benchmark_smoke_and_baselines_agree():
    bench = _load_bench()
    bench.check_mlp_agrees()          # kina_fx's MLP gradients == the hand-written ones
    # the chain contestants compute the same derivative
    chain = bench.chain_contestants()
    ours = float(np.asarray(chain["kina_fx"]()).reshape(-1)[0])
    floor = float(np.asarray(chain["numpy_tape"]()).reshape(-1)[0])
    assert np.isclose(ours, floor, rtol=1e-10)
    for name in ("pytorch", "hips_autograd"):
        if name in chain:
            assert np.isclose(float(np.asarray(chain[name]()).reshape(-1)[0]), ours, rtol=1e-10)
    results = bench.run(quick=True)
    text = bench.report(results)
    assert "chain of 1000" in text and "MLP step" in text
    assert results["chain"]["kina_fx"]["median_s"] > 0
