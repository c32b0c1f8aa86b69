"""Every public NumPy function, applied to a traced Tensor, has a rule or refuses:
no third outcome (a silently untraced result).

* NumPy dispatches ufuncs and array functions (``np.ufunc``, functions with
  ``_implementation``) to ``Tensor.__array_ufunc__``/``__array_function__``:
  each is either in the rule table (``NUMPY_RULES``: differentiated), in
  ``NONDIFFERENTIABLE`` (boolean or integer results: computed raw), or raises
  kina_fx's TypeError naming it.
* The functions NumPy does not dispatch (constructors, ``np.asarray``, scalar
  types, configuration) can only reach a Tensor's values through
  ``__array__``/``__float__``, which refuse traced Tensors, or through the
  dispatched functions they call: each raises, returns something holding no
  floating-point data (a dtype, a bool, a string), or returns traced values
  (an alias such as ``row_stack``, whose ``vstack`` has a rule).
"""
import warnings

import numpy as np
import pytest

from kina_fx import autograd as ad
from kina_fx.autograd.numpy_protocol import NONDIFFERENTIABLE
from kina_fx.errors import KinaTypeError

#: Public callables (in any of the modules) not called here, and why.
NOT_CALLED = {
    "test": "runs NumPy's own test suite",
    "show_config": "prints the build configuration (no array argument)",
    "show_runtime": "prints the runtime configuration (no array argument)",
    "info": "prints documentation about its argument",
}


def public_callables():
    out = []
    for prefix, module in (("numpy.", np), ("numpy.linalg.", np.linalg), ("numpy.fft.", np.fft)):
        for name in sorted(dir(module)):
            if name.startswith("_"):
                continue
            f = getattr(module, name)
            if callable(f) and name not in NOT_CALLED:
                out.append((prefix + name, f))
    return out


def dispatched(f):
    return isinstance(f, np.ufunc) or hasattr(f, "_implementation")


def holds_float_data(r):
    if isinstance(r, ad.Tensor):
        return True
    if isinstance(r, (float, complex, np.inexact)):
        return True
    if isinstance(r, np.ndarray):
        return r.dtype.kind in "fc" or (r.dtype == object and any(map(holds_float_data, r.flat)))
    if isinstance(r, (list, tuple)):
        return any(holds_float_data(x) for x in r)
    return False


def _all_traced(r):
    if isinstance(r, (list, tuple)):
        return bool(r) and all(map(_all_traced, r))
    return ad.is_traced(r)


def outcome(f, traced):
    """'rule', 'nondifferentiable', 'refused', or a description of a third outcome."""
    if f in ad.NUMPY_RULES:
        return "rule"
    if f in NONDIFFERENTIABLE:
        return "nondifferentiable"
    counts = (f.nin,) if isinstance(f, np.ufunc) else (1, 2, 3, 4)
    last = None
    for n in counts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = f(*[traced] * n)
        except KinaTypeError as exc:
            return "refused" if ("no kina_fx.autograd rule" in str(exc)
                                 or "drop the gradient" in str(exc)) else f"other: {exc}"
        except Exception as exc:          # e.g. missing arguments: try more
            last = exc
            continue
        if dispatched(f):
            return f"returned {type(r).__name__}"
        if _all_traced(r):      # an alias calling functions with rules (row_stack: vstack)
            return "differentiated through rules"
        return "no float data" if not holds_float_data(r) else f"returned float data {r!r}"
    if dispatched(f):
        return f"raised {type(last).__name__}: {last}"
    return "raised"


def test_every_numpy_function_has_a_rule_or_refuses_a_traced_tensor():
    third = {}
    counts = {}
    with ad.Tape() as t:
        traced = t.watch(np.array([0.5, 0.25]))
        for name, f in public_callables():
            result = outcome(f, traced)
            counts[result] = counts.get(result, 0) + 1
            if dispatched(f):
                ok = result in ("rule", "nondifferentiable", "refused")
            else:
                ok = result in ("refused", "raised", "no float data",
                                "differentiated through rules")
            if not ok:
                third[name] = result
    assert not third, third
    assert counts["rule"] >= 25 and counts["refused"] >= 250, counts


@pytest.mark.parametrize("name", ["sum", "mean", "max", "concatenate", "stack", "where",
                                  "clip", "dot", "reshape", "tanh", "matmul", "add"])
def test_the_functions_the_findings_needed_have_rules(name):
    assert getattr(np, name) in ad.NUMPY_RULES


def test_plain_tensors_are_refused_too_by_functions_without_rules():
    with pytest.raises(TypeError, match=r"numpy\.median"):
        np.median(ad.Tensor(np.array([2.0, 1.0])))


def test_the_tables_hold_only_functions_numpy_dispatches():
    assert all(dispatched(f) for f in NONDIFFERENTIABLE)
    assert all(dispatched(f) for f in ad.NUMPY_RULES)


@pytest.mark.parametrize("keywords", [{}, {"keepdims": False}, {"casting": "same_kind"},
                                      {"dtype": None}, {"subok": True}])
def test_a_ufunc_on_a_tensor_takes_its_keywords_at_their_defaults(keywords):
    # NumPy >= 2.4 gives ufuncs signatures; the keywords are read either way.
    x = np.arange(6.0).reshape(2, 3)
    w = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    t = np.ones((2, 4))

    def f(w):
        return ad.sum(np.matmul(x, w, **keywords) * t)
    np.testing.assert_allclose(ad.grad(f)(w), x.T @ t)


@pytest.mark.parametrize("keywords", [{"axes": [(-2, -1), (-2, -1), (-2, -1)]}, {"keepdims": True},
                                      {"dtype": np.float32}, {"casting": "unsafe"}])
def test_a_ufunc_on_a_tensor_refuses_keywords_its_rule_would_ignore(keywords):
    x, w = np.ones((2, 3)), np.ones((3, 4))
    with pytest.raises(KinaTypeError, match="numpy.matmul"):
        ad.grad(lambda w: ad.sum(np.matmul(x, w, **keywords)))(w)
