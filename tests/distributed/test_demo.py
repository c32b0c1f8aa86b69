"""The data-parallel demo (kina_fx/demos/distributed.py) under mpiexec -n 2 and -n 4.

Both models -- the Python autograd MLP and the MLIR-compiled forward with
gradients from the tape -- hold, after every step, the parameters one process
gets on the whole batch (to float32 tolerance), identical on every replica,
and the same global loss.
"""
from __future__ import annotations

import numpy as np
import pytest

from kina_fx import compiled
from kina_fx.demos import distributed as demo
from support.mpi import have_mpi4py

pytestmark = pytest.mark.integration

STEPS = 12


@pytest.fixture(scope="module")
def runs():
    if demo.mpiexec() is None or not have_mpi4py():
        pytest.skip("needs mpi4py and mpiexec: pip install 'kina_fx[mpi]'")
    missing = compiled.missing_mlir_tools()
    if missing:
        pytest.skip(f"the compiled model needs {missing}")
    return {n: demo.launch(n, demo.MODELS, STEPS, batch=64, check=True) for n in (1, 2, 4)}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("model", demo.MODELS)
def test_every_step_matches_one_process_on_the_whole_batch(runs, n, model):
    r = runs[n]["models"][model]
    assert runs[n]["ranks"] == n
    assert len(r["distance"]) == STEPS
    assert max(r["distance"]) < 1e-5, r["distance"]
    np.testing.assert_allclose(r["loss"], r["ref_loss"], rtol=1e-5)
    np.testing.assert_allclose(r["loss"], runs[1]["models"][model]["loss"], rtol=1e-5)
    assert r["replicas_identical"]


def test_the_factor_of_world_size_mistake_is_caught():
    """Averaging ("mean") the gradients of losses already weighted by their share
    of the batch divides the gradient (and the reported loss) by the world size.
    Adam hides most of it -- its step is invariant to the gradient's scale, up to
    its epsilon -- but not all: the check still sees the parameters leave the
    single-process ones, well past the tolerance the right reduction meets."""
    r = demo.launch(2, ["python"], 4, check=True, reduce="mean")["models"]["python"]
    np.testing.assert_allclose(np.asarray(r["loss"]) * 2, r["ref_loss"], rtol=1e-5)
    assert max(r["distance"]) > 1e-5, r["distance"]
    assert r["replicas_identical"]          # consistently wrong on every replica
