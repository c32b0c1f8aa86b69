"""Floating-point conditions at the ABI (docs/abi.md, "Floating-point conditions").

An export whose computation overflows, divides by zero or produces NaN
returns status 0 with NumPy's IEEE result and emits no warning, whatever the
calling process's NumPy error state and warnings filters: the library prints
nothing and raises nothing into its host.  Here warnings are turned into
errors and NumPy's error state into exceptions around each call, so a leaked
warning would become a failed status.  Python code calling kina_fx's own
functions keeps NumPy's rules.  (tests/hosts/c/test_quiet_host.py checks the
same from a C process whose stderr must stay empty.)
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from support.abi import Abi
from support.tapes import F32, LENIENT, OK, Tape, op_status
from kina_fx import gpu_ops
from kina_fx.runtime_ops import ALL_AXES

BIG = np.float32(3e38)

# op, inputs, int32 parameters, output shape: each raises a NumPy floating-point warning
CASES = {
    "log of negatives and 0": ("log", [np.float32([-1.0, 0.0, 2.0])], [], (3,)),
    "exp overflow": ("exp", [np.float32([100.0, 1.0])], [], (2,)),
    "matmul overflow": ("matmul", [np.full((2, 2), BIG), np.full((2, 2), BIG)], [], (2, 2)),
    "add overflow": ("add", [np.float32([BIG]), np.float32([BIG])], [], (1,)),
    "division by 0": ("div", [np.float32([1.0, 0.0]), np.float32([0.0, 0.0])], [], (2,)),
    "pow of a negative": ("pow", [np.float32([-1.0]), np.float32([0.5])], [], (1,)),
    "sum overflow": ("sum", [np.full(4, BIG)], [ALL_AXES, 0], ()),
    "mean overflow": ("mean", [np.full(4, BIG)], [ALL_AXES, 0], ()),
    "softmax of inf": ("softmax", [np.float32([np.inf, np.inf])], [0], (2,)),
}


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    monkeypatch.setenv("KINA_FX_DEVICE", "cpu")


@pytest.fixture(scope="module")
def abi():
    return Abi()


def _expected(op, inputs, params):
    from kina_fx.runtime_ops import BY_NAME

    out = np.zeros(BY_NAME[op].check(*inputs, *params), np.float32)
    with np.errstate(all="ignore"):
        BY_NAME[op].kernel(out, *inputs, *params)
    return out


@pytest.mark.parametrize("taped", [False, True], ids=["untaped", "taped"])
@pytest.mark.parametrize("case", CASES)
def test_fp_conditions_give_ieee_results_and_no_warning(abi, case, taped):
    op, inputs, params, shape = CASES[case]
    out = np.zeros(shape, np.float32)
    tape = Tape(abi, LENIENT) if taped else None
    try:
        with warnings.catch_warnings(), np.errstate(all="raise"):
            warnings.simplefilter("error")
            status = op_status(abi, op, out, *inputs, *params)
    finally:
        if tape is not None:
            tape.free()
    assert status == OK, abi.last_error()
    np.testing.assert_array_equal(out, _expected(op, inputs, params))


def test_backward_through_an_infinite_derivative_gives_inf_and_no_warning(abi):
    """d sum(log(w)) / dw = 1 / w: infinite at 0."""
    w = np.float32([0.0, 1.0, 4.0])
    lw, s, g = np.zeros_like(w), np.zeros((), np.float32), np.zeros_like(w)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        t = Tape(abi)
        assert t.call("watch", w, F32) == OK
        t.op("log", lw, w)
        t.op("sum", s, lw, ALL_AXES, 0)
        t.end()
        assert t.call("backward", s, np.ones((), np.float32)) == OK, abi.last_error()
        assert t.call("grad", w, g) == OK, abi.last_error()
        t.free()
    np.testing.assert_array_equal(lw, np.float32([-np.inf, 0.0, np.log(4)]))
    np.testing.assert_array_equal(g, np.float32([np.inf, 1.0, 0.25]))


def test_the_callers_numpy_error_state_is_left_as_it_was(abi):
    x, out = np.float32([-1.0]), np.zeros(1, np.float32)
    with np.errstate(divide="raise", over="warn", invalid="call", under="ignore"):
        before = np.geterr()
        assert op_status(abi, "log", out, x) == OK
        assert np.geterr() == before
    assert np.isnan(out[0])


def test_python_code_calling_kina_fx_keeps_numpys_rules():
    with pytest.warns(RuntimeWarning, match="invalid value"):
        gpu_ops.log(np.float32([-1.0]))
    with np.errstate(invalid="raise"), pytest.raises(FloatingPointError):
        gpu_ops.log(np.float32([-1.0]))
