"""The argument forms NumPy documents, taken as NumPy takes them.

kina_fx's functions and the NumPy functions that dispatch to them on Tensors
are documented "as NumPy"; each test here is a form that raised or gave a
wrong answer (issue 16: an array passed as the sequence of ``vstack``, a list
passed to ``reshape`` with ``-1``), with its siblings found by the audit:
every value is compared with NumPy's on the untraced arguments and every
gradient with central differences of NumPy's function.  The generated check
over the whole NumPy mapping is test_autograd_traced_equals_untraced.py.
"""
import inspect

import numpy as np
import pytest

from kina_fx import autograd as ad
from kina_fx.errors import KinaTypeError, UnimplementedError

EPS = 1e-6
RNG = np.random.default_rng(16)
A = RNG.standard_normal((2, 3))
SPD = np.array([[2.0, 0.5], [0.3, 3.0]])         # the two triangles differ


def check(f, *xs, via=np.float64):
    """``f(*xs)`` traced equals ``f`` on the arrays, and its vjp and jvp
    match central differences of ``f`` on the arrays."""
    expected = np.asarray(f(*xs))
    value, vjp_fn = ad.vjp(f, *xs)
    np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-12, atol=1e-14)
    assert np.shape(value) == expected.shape
    u = RNG.standard_normal(expected.shape)
    dirs = [RNG.standard_normal(np.shape(x)) for x in xs]
    fd = (np.asarray(f(*[x + EPS * d for x, d in zip(xs, dirs)]), via)
          - np.asarray(f(*[x - EPS * d for x, d in zip(xs, dirs)]), via)) / (2 * EPS)
    cts = vjp_fn(u)
    np.testing.assert_allclose(sum(np.sum(c * d) for c, d in zip(cts, dirs)), np.sum(u * fd),
                               rtol=1e-6, atol=1e-8)
    _, tangent = ad.jvp(f, tuple(xs), tuple(dirs))
    np.testing.assert_allclose(np.asarray(tangent), fd, rtol=1e-6, atol=1e-8)


# --- an array passed where NumPy takes a sequence of arrays ------------------------------


SEQUENCE_FUNCTIONS = [np.vstack, np.hstack, np.column_stack, np.dstack, np.stack,
                      np.concatenate]


@pytest.mark.parametrize("numpy_fn", SEQUENCE_FUNCTIONS, ids=lambda f: f.__name__)
def test_an_array_is_a_sequence_of_its_rows(numpy_fn):
    ours = getattr(ad, numpy_fn.__name__)
    # kina_fx's function on an array, on a Tensor, and NumPy's on a Tensor
    np.testing.assert_array_equal(np.asarray(ours(A)), numpy_fn(A))
    np.testing.assert_array_equal(ours(ad.Tensor(A)).data, numpy_fn(A))
    check(lambda x: numpy_fn(x), A)
    check(lambda x: ours(x), A)
    # a tuple, and rows that are themselves arrays of arrays
    check(lambda x, y: numpy_fn((x, y)), A, 2 * A)


@pytest.mark.parametrize("numpy_fn", [np.stack, np.concatenate], ids=lambda f: f.__name__)
def test_an_array_as_the_sequence_with_an_axis(numpy_fn):
    for axis in (0, -1, 1) if numpy_fn is np.stack else (0, -1):
        check(lambda x: numpy_fn(x, axis=axis), A)
        check(lambda x: numpy_fn(x, axis), A)
    check(lambda x: np.concatenate(x, axis=None), A)


def test_a_scalar_is_not_a_sequence():
    for fn in (ad.vstack, ad.stack, ad.concatenate):
        with pytest.raises(TypeError):
            fn(np.float64(1.0))
        with pytest.raises(TypeError):
            fn(ad.Tensor(1.0))


# --- a list passed where NumPy takes an array --------------------------------------------


def test_lists_are_arrays_of_their_size():
    assert ad.reshape([1.0, 2.0, 3.0], (-1,)).shape == (3,)
    np.testing.assert_array_equal(ad.reshape([[1.0, 2.0], [3.0, 4.0]], (-1, 1)),
                                  np.reshape([[1.0, 2.0], [3.0, 4.0]], (-1, 1)))
    np.testing.assert_array_equal(ad.cumsum([1.0, 2.0, 3.0]), np.cumsum([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(ad.ravel([[1.0, 2.0], [3.0, 4.0]]), [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(ad.squeeze([[1.0, 2.0]]), [1.0, 2.0])
    np.testing.assert_array_equal(ad.outer([1.0, 2.0], [3.0, 4.0]), np.outer([1, 2], [3, 4]))
    # a list holding traced values is stacked, differentiably
    check(lambda x: ad.reshape([x, 2 * x], (-1,)), A[0])
    check(lambda x: ad.reshape(x, shape=[-1, 2]), A)


# --- NumPy's positional and keyword forms, bound by NumPy's signature ----------------------


def test_positional_arguments_mean_what_they_mean_in_numpy():
    # the third positional argument of np.mean/np.sum is dtype, of np.max out:
    # never keepdims
    check(lambda x: np.mean(x, 1, None, None, True), A)
    check(lambda x: np.sum(x, 0, None, None, True), A)
    check(lambda x: np.max(x, 1, None, True), A)
    check(lambda x: np.var(x, 1, None, None, 1), A)
    check(lambda x: np.cumsum(x, 1, None), A)
    check(lambda x: np.concatenate([x, x], 1, None), A)
    for call in (lambda x: np.mean(x, 1, np.float32), lambda x: np.sum(x, 0, np.float32),
                 lambda x: np.max(x, 1, np.zeros(2))):
        with pytest.raises(KinaTypeError):     # dtype, out: refused, not taken as keepdims
            ad.grad(lambda x: ad.sum(call(x)))(A)


def test_keyword_forms_and_defaults_numpy_documents():
    if inspect.signature(np.take_along_axis).parameters["axis"].default == -1:   # NumPy >= 2.3
        check(lambda x: np.take_along_axis(x, np.array([[2, 0], [1, 1]])), A)
    check(lambda x: np.clip(x, min=-0.5, max=0.5), A)
    check(lambda x: np.clip(x, max=0.5), A)
    check(lambda x: np.reshape(x, shape=(3, 2), order="C", copy=None), A)
    check(lambda x: np.reshape(x, (3, -1), order="F"), A)
    check(lambda x: np.ravel(x, order="F"), A)
    check(lambda x: np.ravel(x, "C"), A)
    check(lambda x: np.broadcast_to(x, (2, 2, 3), subok=False), A)
    check(lambda x: np.add(x, 1.0, casting="same_kind", where=True, order="K"), A)
    check(lambda x: np.linalg.cholesky(x, upper=False), SPD)
    check(lambda x: np.linalg.cholesky(x, upper=True), SPD)
    check(lambda x: ad.cholesky(x, upper=True), SPD)
    g = ad.grad(lambda x: ad.sum(np.linalg.cholesky(x, upper=True)))(SPD)
    assert g[1, 0] == 0.0                   # upper=True reads the upper triangle only


def test_memory_order_is_refused_not_guessed():
    # 'A' and 'K' follow the memory layout, which tracing does not promise to keep
    for call in (lambda x: np.reshape(x, (3, 2), order="A"), lambda x: np.ravel(x, "K"),
                 lambda x: ad.ravel(x, order="A")):
        with pytest.raises(UnimplementedError, match="memory layout"):
            ad.grad(lambda x: ad.sum(call(x)))(A)
