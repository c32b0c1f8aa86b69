"""Breadth ops (linalg): ``numpy.linalg`` inv, solve, det, slogdet, cholesky,
eigh, eigvalsh, svd, svdvals and norm, batched over leading axes.

One ``@op`` block each (docs/autograd.md, "How to add an op"), or a function
composed of primitives (its docstring says so).  Every public name in
``__all__`` is re-exported by ``kina_fx.autograd``.

Decompositions with several results (``eigh``, ``svd``) are one primitive
returning its results stacked in one array (``eigh_packed``,
``svd_packed``), which the public function takes apart with ``getitem``, so
each result's cotangent reaches the one rule.  Where a derivative does not
exist -- repeated eigenvalues or singular values that the cotangent couples,
zero singular values of a non-square matrix -- the rules raise a
``ValidationError`` instead of returning a NaN or a wrong number (see
docs/autograd.md, "Linear algebra").
"""
from __future__ import annotations

import collections
import math
import operator as _operator

import numpy as np
import numpy as _numpy      # references get ``np`` as a parameter; constants use NumPy

from .. import gpu_ops
from ..errors import UnimplementedError, ValidationError
from .ops_math import abs as _abs
from .ops_math import min as _min
from .ops_core import max as _max
from .ops_core import reshape, transpose
from .ops_core import sum as _sum
from .primitives import axis_param, norm_axes, numpy_rule, op, unbroadcast
from .tensor import Tensor, _as_array, _raw, _shape, array_module, recordable

__all__ = ["inv", "solve", "det", "logabsdet", "slogdet", "cholesky", "eigh", "eigvalsh",
           "svd", "svdvals", "l2_norm", "norm", "SlogdetResult", "EighResult", "SVDResult"]

_pymax, _pymin = max, min

SlogdetResult = collections.namedtuple("SlogdetResult", "sign logabsdet")
EighResult = collections.namedtuple("EighResult", "eigenvalues eigenvectors")
SVDResult = collections.namedtuple("SVDResult", "U S Vh")


# --- helpers ------------------------------------------------------------------------------


def _mT(o, x):
    """``x`` with its last two axes swapped."""
    nd = len(x.shape)
    return o.transpose(x, tuple(range(nd - 2)) + (nd - 1, nd - 2))


def _check_square(name, a):
    shape = _shape(a)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValidationError(f"{name} needs square matrices (shape (..., n, n)), got "
                              f"shape {tuple(shape)}")


def _dtype(v):
    v = _raw(v)
    return v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype


def _eye(like, n):
    rv = _raw(like)
    return array_module(rv).eye(n, dtype=_dtype(rv))


def _lower_weights(like, n):
    """1 below the diagonal, 1/2 on it, 0 above (a constant)."""
    rv = _raw(like)
    xp = array_module(rv)
    return xp.tril(xp.ones((n, n), dtype=_dtype(rv))) - 0.5 * xp.eye(n, dtype=_dtype(rv))


def _triangle_weights(like, n, uplo):
    """``_lower_weights``, or their transpose for the upper triangle."""
    w = _lower_weights(like, n)
    return w if uplo == "L" else w.T


def _symmetric_from(o, a, uplo="L"):
    """The symmetric matrix NumPy's cholesky and eigh read from ``a``: its
    lower (``uplo='L'``) or upper triangle, mirrored."""
    if uplo == "L":
        return o.add(o.tril(a, 0), _mT(o, o.tril(a, -1)))
    return o.add(o.triu(a, 0), _mT(o, o.triu(a, 1)))


def _triangle_gradient(o, grad, uplo="L"):
    """The gradient with respect to ``a`` of a function of
    ``_symmetric_from(a, uplo)``, given ``grad`` with respect to that
    matrix: both triangles' parts land on the one that is read."""
    n = grad.shape[-1]
    return o.mul(o.add(grad, _mT(o, grad)), _triangle_weights(grad, n, uplo))


def _symmetric_reference(np, a, uplo):
    """``_symmetric_from`` in NumPy terms (HIPS autograd differentiates it)."""
    if uplo == "L":
        return np.tril(a) + np.swapaxes(np.tril(a, -1), -1, -2)
    return np.triu(a) + np.swapaxes(np.triu(a, 1), -1, -2)


def _col(o, v):
    return o.reshape(v, tuple(v.shape) + (1,))


def _uncol(o, v):
    return o.reshape(v, tuple(v.shape)[:-1])


def _rows(o, v):
    """``v[..., None, :]``."""
    shape = tuple(v.shape)
    return o.reshape(v, shape[:-1] + (1,) + shape[-1:])


def _diagonal_of(o, m):
    """The diagonals of the last two axes of square ``m``."""
    return o.sum(o.mul(m, _eye(m, m.shape[-1])), -1, False)


def _gaps(v):
    """``v[..., j] - v[..., i]`` as (..., i, j), raw."""
    return v[..., None, :] - v[..., :, None]


#: Values closer than this many machine epsilons (relative to the largest) are
#: taken as repeated; cotangent entries smaller than it (relative) as zero.
ROUNDING = 1e3


def _largest(*values):
    scale = 0.0
    for v in values:
        rv = _raw(v)
        if rv.size:
            scale = _pymax(scale, float(array_module(rv).max(array_module(rv).abs(rv))))
    return scale


def _tolerance(v):
    """The gap below which two of the values ``v`` count as repeated."""
    return ROUNDING * float(np.finfo(_dtype(v)).eps) * _pymax(1.0, _largest(v))


def _coupling_tolerance(*values):
    """The size below which an entry of these cotangents counts as zero."""
    return ROUNDING * float(np.finfo(_dtype(values[0])).eps) * _pymax(_largest(*values), 1e-300)


def _repeated(v, squared=False):
    """Raw mask (..., i, j) of pairs ``i != j`` with equal values of ``v``
    (``squared``: equal squares) up to rounding."""
    rv = _raw(v)
    xp = array_module(rv)
    n = rv.shape[-1]
    w = rv * rv if squared else rv
    close = xp.abs(_gaps(w)) <= _tolerance(w)
    return close & ~xp.eye(n, dtype=bool)


def _inverse_gaps(o, v, repeated, squared=False):
    """``F[..., i, j] = 1 / (v_j - v_i)`` (of squares if ``squared``), 0 on
    the diagonal and on repeated pairs; differentiable in ``v``."""
    n = v.shape[-1]
    w = o.mul(v, v) if squared else v
    gaps = o.sub(_rows(o, w), _col(o, w))
    skip = repeated | array_module(_raw(v)).eye(n, dtype=bool)
    return o.where(skip, 0.0, o.div(1.0, o.where(skip, 1.0, gaps)))


def _nonzero(part, mask, tol):
    """Whether raw ``part`` has an entry above ``tol`` where ``mask`` is set."""
    rp = _raw(part)
    return bool((array_module(rp).abs(rp)[mask] > tol).any())


def _nonzero_columns(part, columns, tol):
    """Whether raw ``part`` (..., rows, n) has an entry above ``tol`` in a
    column selected by ``columns`` (..., n)."""
    rp = _raw(part)
    if not rp.shape[-2]:
        return False
    return bool((array_module(rp).abs(rp).max(axis=-2)[columns] > tol).any())


def _undefined(name, what, zero=False):
    if zero:
        return ValidationError(
            f"svd: {what} at a zero singular value of a non-square matrix is not defined: "
            "its singular vector on the longer side is not unique")
    values = "singular values" if name == "svd" else "eigenvalues"
    vectors = "singular vectors" if name == "svd" else "eigenvectors"
    return ValidationError(
        f"{name}: {what} at repeated {values} is not defined: the {vectors} of a repeated "
        f"value are not unique (any rotation of them is as valid), and this {what[4:]} "
        f"depends on them, or treats the repeated {values} unequally")


def _sample_square():
    """Well-conditioned square matrices, possibly batched."""
    def sample(draw):
        n = draw.integers(1, 3)
        a = draw.array(draw.shape(max_dims=1, max_side=2) + (n, n)) * (0.4 / n) + np.eye(n)
        return [a], {}
    return sample


# =====================================================================================
# Inverse, solve, determinants
# =====================================================================================


@op(numpy=np.linalg.inv, sample=_sample_square(), reference=lambda np, a: np.linalg.inv(a))
class inv:
    """The inverse of each square matrix (``(..., n, n)``); a singular matrix
    is NumPy's ``LinAlgError``."""
    def kernel(a):
        _check_square("inv", a)
        return array_module(a).linalg.inv(a)

    def vjp_a(o, g, out, a):
        inv_t = _mT(o, out)
        return o.neg(o.matmul(inv_t, o.matmul(g, inv_t)))

    def jvp_a(o, t, out, a):
        return o.neg(o.matmul(out, o.matmul(t, out)))


def _sample_solve(draw):
    n = draw.integers(1, 3)
    lead_a, lead_b = draw.broadcastable(2, max_dims=1, max_side=2)
    a = draw.array(lead_a + (n, n)) * (0.4 / n) + np.eye(n)
    if draw.boolean():
        return [a, draw.array((n,))], {}
    return [a, draw.array(lead_b + (n, draw.integers(1, 2)))], {}


def _is_vector(b):
    return len(_shape(b)) == 1


def _solve_reference(np, a, b):
    # batch axes broadcast first, and a vector b as a column (HIPS autograd's rule needs both)
    vector = np.ndim(b) == 1
    if vector:
        b = b[:, None]
    ones = _numpy.ones(_numpy.broadcast_shapes(np.shape(a)[:-2], np.shape(b)[:-2]) + (1, 1))
    x = np.linalg.solve(a * ones, b * ones)
    return x[..., 0] if vector else x


@op(numpy=np.linalg.solve, sample=_sample_solve, reference=_solve_reference)
class solve:
    """``x`` with ``a @ x == b``, NumPy 2's rules: ``b`` is a vector only when
    it is 1-D, else a stack of matrices ``(..., n, k)``; batch axes broadcast."""
    def kernel(a, b):
        _check_square("solve", a)
        n = _shape(a)[-1]
        shape_b = _shape(b)
        if not shape_b or (shape_b[0] if len(shape_b) == 1 else shape_b[-2]) != n:
            raise ValidationError(f"solve: b of shape {tuple(shape_b)} for a of shape "
                                  f"{tuple(_shape(a))}")
        xp = array_module(a, b)
        vector = len(shape_b) == 1
        if vector:
            b, shape_b = b[:, None], shape_b + (1,)
        # matrices (..., n, k) with the batch axes broadcast explicitly, so that
        # NumPy 1 (which takes b of rank a.ndim - 1 as vectors) agrees with NumPy 2
        batch = np.broadcast_shapes(_shape(a)[:-2], shape_b[:-2])
        x = xp.linalg.solve(xp.broadcast_to(a, batch + _shape(a)[-2:]),
                            xp.broadcast_to(b, batch + shape_b[-2:]))
        return x[..., 0] if vector else x

    def vjp_a(o, g, out, a, b):
        vector = _is_vector(b)
        gb = o.solve(_mT(o, a), _col(o, g) if vector else g)
        x = _col(o, out) if vector else out
        return unbroadcast(o, o.neg(o.matmul(gb, _mT(o, x))), _shape(a))

    def vjp_b(o, g, out, a, b):
        if _is_vector(b):
            gb = _uncol(o, o.solve(_mT(o, a), _col(o, g)))
        else:
            gb = o.solve(_mT(o, a), g)
        return unbroadcast(o, gb, _shape(b))

    def jvp_a(o, t, out, a, b):
        if _is_vector(b):
            return o.neg(_uncol(o, o.solve(a, o.matmul(t, _col(o, out)))))
        return o.neg(o.solve(a, o.matmul(t, out)))

    def jvp_b(o, t, out, a, b):
        return o.solve(a, t)


def _matrix_scale(o, v):
    """``v`` (one number per matrix) with two size-1 axes, to scale matrices."""
    return o.reshape(v, tuple(_shape(v)) + (1, 1))


@op(numpy=np.linalg.det, sample=_sample_square(), reference=lambda np, a: np.linalg.det(a))
class det:
    """The determinant of each square matrix.  Its gradient ``det(a) *
    inv(a).T`` needs an invertible matrix: at a singular one it is NumPy's
    ``LinAlgError``, not a wrong number."""
    def kernel(a):
        _check_square("det", a)
        return array_module(a).linalg.det(a)

    def vjp_a(o, g, out, a):
        return o.mul(_matrix_scale(o, o.mul(g, out)), _mT(o, o.inv(a)))

    def jvp_a(o, t, out, a):
        return o.mul(out, o.sum(o.mul(_mT(o, o.inv(a)), t), (-2, -1), False))


@op(sample=_sample_square(), reference=lambda np, a: np.linalg.slogdet(a)[1])
class logabsdet:
    """``log|det(a)|`` of each square matrix, computed without overflow (the
    second result of ``slogdet``)."""
    def kernel(a):
        _check_square("slogdet", a)
        return array_module(a).linalg.slogdet(a)[1]

    def vjp_a(o, g, out, a):
        return o.mul(_matrix_scale(o, g), _mT(o, o.inv(a)))

    def jvp_a(o, t, out, a):
        return o.sum(o.mul(_mT(o, o.inv(a)), t), (-2, -1), False)


@numpy_rule(np.linalg.slogdet, sample=_sample_square(),
            reference=lambda np, a: tuple(np.linalg.slogdet(a)))
def slogdet(a):
    """``(sign, logabsdet)`` of each square matrix, as NumPy's
    ``SlogdetResult``: ``sign`` is piecewise constant (no derivative),
    ``logabsdet`` is the primitive ``logabsdet``."""
    a = _as_array(a)
    ra = _raw(a)
    _check_square("slogdet", ra)
    sign = array_module(ra).linalg.slogdet(ra)[0]
    return SlogdetResult(Tensor(sign) if isinstance(a, Tensor) else sign, logabsdet(a))


# =====================================================================================
# Cholesky
# =====================================================================================


def _sample_spd(draw):
    n = draw.integers(1, 3)
    lead = draw.shape(max_dims=1, max_side=2)
    b = draw.array(lead + (n, n))
    spd = b @ np.swapaxes(b, -1, -2) / n + np.eye(n)
    # the upper triangle is never read: fill it with noise
    return [np.tril(spd) + np.triu(draw.array(lead + (n, n)), 1)], {}


def _solve_lower_both_sides(o, lower, m):
    """``L^-1 m L^-T`` for symmetric ``m``."""
    x = o.solve(lower, m)
    return o.solve(lower, _mT(o, x))


def _cholesky_vjp(o, g, lower):
    # Murray (2016): S = L^-T Phi(L^T g) L^-1, Phi = lower triangle with half diagonal
    n = lower.shape[-1]
    phi = o.mul(o.matmul(_mT(o, lower), g), _lower_weights(g, n))
    lower_t = _mT(o, lower)
    s = _mT(o, o.solve(lower_t, _mT(o, o.solve(lower_t, phi))))
    return _triangle_gradient(o, o.mul(o.add(s, _mT(o, s)), 0.5))


def _cholesky_jvp(o, t, lower):
    inner = _solve_lower_both_sides(o, lower, _symmetric_from(o, t))
    return o.matmul(lower, o.mul(inner, _lower_weights(inner, lower.shape[-1])))


def _sample_cholesky(draw):
    args, _ = _sample_spd(draw)
    upper = draw.choice([None, False, True])
    if upper is None:
        return args, {}
    return [np.swapaxes(args[0], -1, -2).copy() if upper else args[0]], {"upper": upper}


def _cholesky_reference(np, a, upper=False):
    if upper:
        return np.swapaxes(_cholesky_reference(np, np.swapaxes(a, -1, -2)), -1, -2)
    return np.linalg.cholesky(_symmetric_reference(np, a, "L"))


@op(numpy=np.linalg.cholesky, sample=_sample_cholesky, reference=_cholesky_reference)
class cholesky:
    """The lower Cholesky factor ``L`` of each symmetric positive definite
    matrix (``a = L @ L.T``), or with ``upper=True`` the upper one ``U = L.T``
    of the matrix read from the upper triangle.  As NumPy, only that triangle
    of ``a`` is read, and the gradient is that of this function: it lies on
    that triangle (JAX instead symmetrizes the input; pass ``(a + a.T) / 2``
    for its convention).  A matrix that is not positive definite is NumPy's
    ``LinAlgError``."""
    def kernel(a, upper=False):
        _check_square("cholesky", a)
        xp = array_module(a)
        if not upper:
            return xp.linalg.cholesky(a)
        # NumPy < 2 and CuPy have no upper=: U(a) = L(a^T)^T, the same factor
        return xp.swapaxes(xp.linalg.cholesky(xp.swapaxes(a, -1, -2)), -1, -2)

    def prepare(a, upper=False):
        return a, bool(upper)

    def vjp_a(o, g, out, a, upper):
        if upper:
            return _mT(o, _cholesky_vjp(o, _mT(o, g), _mT(o, out)))
        return _cholesky_vjp(o, g, out)

    def jvp_a(o, t, out, a, upper):
        if upper:
            return _mT(o, _cholesky_jvp(o, _mT(o, t), _mT(o, out)))
        return _cholesky_jvp(o, t, out)


# =====================================================================================
# Symmetric eigendecomposition
# =====================================================================================


def _check_uplo(uplo):
    if uplo not in ("L", "U"):
        raise ValidationError(f"eigh: UPLO must be 'L' or 'U', not {uplo!r}")
    return uplo


def _sample_symmetric(draw):
    """A symmetric matrix with well separated eigenvalues in the triangle
    ``UPLO`` names, noise in the other (never read)."""
    n = draw.integers(1, 3)
    lead = draw.shape(max_dims=1, max_side=2)
    q = np.linalg.qr(draw.array(lead + (n, n)))[0]
    w = np.linspace(-1.0, 1.5, n) + 0.1 * draw.array(lead + (n,))
    sym = (q * w[..., None, :]) @ np.swapaxes(q, -1, -2)
    a = np.tril(sym) + np.triu(draw.array(lead + (n, n)), 1)
    uplo = draw.choice(["L", "U", None])
    if uplo is None:
        return [a], {}
    return [a if uplo == "L" else np.swapaxes(a, -1, -2).copy()], {"UPLO": uplo}


def _eigh_parts(o, packed):
    w = o.getitem(packed, (Ellipsis, 0, slice(None)))
    v = o.getitem(packed, (Ellipsis, slice(1, None), slice(None)))
    return w, v


def _eigh_reference(np, a, UPLO="L"):
    # the same triangle as the kernel, so that LAPACK picks the same signs
    return np.linalg.eigh(_symmetric_reference(np, a, UPLO), UPLO)


def _eigh_packed_reference(np, a, UPLO="L"):
    w, v = _eigh_reference(np, a, UPLO)
    return np.concatenate([w[..., None, :], v], -2)


@op(sample=_sample_symmetric, reference=_eigh_packed_reference)
class eigh_packed:
    """``eigh`` as one primitive: eigenvalues (row 0) and eigenvectors (rows
    1..n, as columns) of each symmetric matrix stacked in one ``(..., n + 1,
    n)`` array.  Reads the lower (``UPLO='L'``) or upper triangle, as NumPy,
    and asks LAPACK for that very triangle: the eigenvectors' signs are
    LAPACK's choice, and differ between the two.  At repeated eigenvalues
    the derivative exists only for cotangents (tangents) that do not couple
    the repeated eigenvectors, with equal eigenvalue cotangents; others raise
    a ValidationError."""
    def kernel(a, UPLO):
        _check_square("eigh", a)
        xp = array_module(a)
        w, v = xp.linalg.eigh(a, UPLO=UPLO)
        return xp.concatenate([w[..., None, :], v], -2)

    def prepare(a, UPLO="L"):
        a = _as_array(a)
        _check_square("eigh", _raw(a))
        return a, _check_uplo(UPLO)

    def vjp_a(o, g, out, a, UPLO):
        w, v = _eigh_parts(o, out)
        gw, gv = _eigh_parts(o, g)
        repeated = _repeated(w)
        if repeated.any():
            tol = _coupling_tolerance(gw, gv)
            if (_nonzero_columns(gv, repeated.any(-1), tol)
                    or _nonzero(_gaps(_raw(gw)), repeated, tol)):
                raise _undefined("eigh", "the gradient")
        coupling = o.matmul(_mT(o, v), gv)
        inner = o.add(o.mul(_rows(o, gw), _eye(w, w.shape[-1])),
                      o.mul(_inverse_gaps(o, w, repeated), coupling))
        return _triangle_gradient(o, o.matmul(v, o.matmul(inner, _mT(o, v))), UPLO)

    def jvp_a(o, t, out, a, UPLO):
        w, v = _eigh_parts(o, out)
        repeated = _repeated(w)
        c = o.matmul(_mT(o, v), o.matmul(_symmetric_from(o, t, UPLO), v))
        dw = _diagonal_of(o, c)
        if repeated.any():   # defined only if the repeated eigenvalues move as one
            tol = _coupling_tolerance(c)
            if _nonzero(c, repeated, tol) or _nonzero(_gaps(_raw(dw)), repeated, tol):
                raise _undefined("eigh", "the tangent")
        dv = o.matmul(v, o.mul(_inverse_gaps(o, w, repeated), c))
        return o.concatenate([_rows(o, dw), dv], -2)


@numpy_rule(np.linalg.eigh, sample=_sample_symmetric,
            reference=lambda np, a, UPLO="L": tuple(_eigh_reference(np, a, UPLO)))
def eigh(a, UPLO="L"):
    """``(eigenvalues, eigenvectors)`` of each symmetric matrix, ascending, as
    NumPy's ``EighResult``: reads the lower (``UPLO='L'``) or upper triangle
    only, and differentiates that function.  Composed from ``eigh_packed``
    (see there for repeated eigenvalues)."""
    packed = eigh_packed(a, UPLO)
    w, v = _eigh_parts(recordable, packed)
    return EighResult(w, v)


@numpy_rule(np.linalg.eigvalsh, sample=_sample_symmetric,
            reference=lambda np, a, UPLO="L": _eigh_reference(np, a, UPLO)[0])
def eigvalsh(a, UPLO="L"):
    """The eigenvalues of each symmetric matrix, ascending: ``eigh(a)[0]``.
    The gradient exists at repeated eigenvalues only if their cotangents are
    equal (a symmetric function of them); otherwise a ValidationError."""
    return eigh(a, UPLO)[0]


# =====================================================================================
# Singular value decomposition
# =====================================================================================


def _sample_svd(draw):
    m, n = draw.integers(1, 3), draw.integers(1, 3)
    k = _pymin(m, n)
    lead = draw.shape(max_dims=1, max_side=2)
    qu = np.linalg.qr(draw.array(lead + (m, m)))[0][..., :k]
    qv = np.linalg.qr(draw.array(lead + (n, n)))[0][..., :k]
    s = np.linspace(2.0, 0.8, k) + 0.1 * np.abs(draw.array(lead + (k,)))
    return [(qu * s[..., None, :]) @ np.swapaxes(qv, -1, -2)], {}


def _svd_parts(o, packed, m):
    u = o.getitem(packed, (Ellipsis, slice(0, m), slice(None)))
    s = o.getitem(packed, (Ellipsis, m, slice(None)))
    v = o.getitem(packed, (Ellipsis, slice(m + 1, None), slice(None)))
    return u, s, v


def _svd_packed_reference(np, a):
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    return np.concatenate([u, s[..., None, :], np.swapaxes(vh, -1, -2)], -2)


def _zero_singular(s, m, n):
    """Raw mask of the zero singular values of non-square matrices (those of a
    square matrix are unique: no special case)."""
    rs = _raw(s)
    xp = array_module(rs)
    if m == n:
        return xp.zeros(rs.shape, dtype=bool)
    return xp.abs(rs) <= _tolerance(rs)


def _safe_inverse(o, s, zero):
    return o.where(zero, 0.0, o.div(1.0, o.where(zero, 1.0, s)))


@op(sample=_sample_svd, reference=_svd_packed_reference)
class svd_packed:
    """The reduced SVD as one primitive: ``U`` (rows 0..m-1), the singular
    values (row m) and ``V = Vh.T`` (rows m+1..) stacked in one ``(..., m + 1
    + n, k)`` array, ``k = min(m, n)``.  Where singular values repeat (or are
    0 in a non-square matrix) the derivative exists only for cotangents
    (tangents) that do not depend on the choice of singular vectors; others
    raise a ValidationError."""
    def kernel(a):
        shape = _shape(a)
        if len(shape) < 2:
            raise ValidationError(f"svd needs matrices (shape (..., m, n)), got {tuple(shape)}")
        xp = array_module(a)
        u, s, vh = xp.linalg.svd(a, full_matrices=False)
        return xp.concatenate([u, s[..., None, :], xp.swapaxes(vh, -1, -2)], -2)

    def vjp_a(o, g, out, a):
        m, n = a.shape[-2], a.shape[-1]
        u, s, v = _svd_parts(o, out, m)
        gu, gs, gv = _svd_parts(o, g, m)
        k = s.shape[-1]
        repeated = _repeated(s, squared=True)
        zero = _zero_singular(s, m, n)
        if repeated.any() or zero.any():
            # the vectors of repeated values, and the longer side's vector of a zero
            # singular value, are not unique: their cotangents must be 0
            tol = _coupling_tolerance(gu, gs, gv)
            loose = repeated.any(-1)
            if (_nonzero_columns(gu, loose, tol) or _nonzero_columns(gv, loose, tol)
                    or _nonzero(_gaps(_raw(gs)), repeated, tol)):
                raise _undefined("svd", "the gradient")
            if _nonzero_columns(gu if m > n else gv, zero, tol):
                raise _undefined("svd", "the gradient", zero=True)
        cu = o.matmul(_mT(o, u), gu)
        cv = o.matmul(_mT(o, v), gv)
        f = _inverse_gaps(o, s, repeated, squared=True)
        inner = o.add(o.add(o.mul(o.mul(f, o.sub(cu, _mT(o, cu))), _rows(o, s)),
                            o.mul(_rows(o, gs), _eye(s, k))),
                      o.mul(_col(o, s), o.mul(f, o.sub(cv, _mT(o, cv)))))
        grad = o.matmul(u, o.matmul(inner, _mT(o, v)))
        inverse_s = _safe_inverse(o, s, zero)
        if m > k:   # (I - U U^T) gU S^-1 V^T
            rest = o.sub(gu, o.matmul(u, cu))
            grad = o.add(grad, o.matmul(o.mul(rest, _rows(o, inverse_s)), _mT(o, v)))
        if n > k:   # U S^-1 gV^T (I - V V^T)
            rest = o.sub(gv, o.matmul(v, cv))
            grad = o.add(grad, o.matmul(o.mul(u, _rows(o, inverse_s)), _mT(o, rest)))
        return grad

    def jvp_a(o, t, out, a):
        m, n = a.shape[-2], a.shape[-1]
        u, s, v = _svd_parts(o, out, m)
        repeated = _repeated(s, squared=True)
        zero = _zero_singular(s, m, n)
        p = o.matmul(_mT(o, u), o.matmul(t, v))
        f = _inverse_gaps(o, s, repeated, squared=True)
        ds = _diagonal_of(o, p)
        if zero.any():
            raise _undefined("svd", "the tangent", zero=True)
        if repeated.any():   # defined only if the repeated values move as one
            tol = _coupling_tolerance(p)
            if _nonzero(p, repeated, tol) or _nonzero(_gaps(_raw(ds)), repeated, tol):
                raise _undefined("svd", "the tangent")
        s_row, s_col = _rows(o, s), _col(o, s)
        du = o.matmul(u, o.mul(f, o.add(o.mul(p, s_row), o.mul(s_col, _mT(o, p)))))
        dv = o.matmul(v, o.mul(f, o.add(o.mul(s_col, p), o.mul(_mT(o, p), s_row))))
        inverse_s = _safe_inverse(o, s, zero)
        k = s.shape[-1]
        if m > k:   # (I - U U^T) dA V S^-1
            rest = o.sub(o.matmul(t, v), o.matmul(u, p))
            du = o.add(du, o.mul(rest, _rows(o, inverse_s)))
        if n > k:   # (I - V V^T) dA^T U S^-1
            rest = o.sub(o.matmul(_mT(o, t), u), o.matmul(v, _mT(o, p)))
            dv = o.add(dv, o.mul(rest, _rows(o, inverse_s)))
        return o.concatenate([du, _rows(o, ds), dv], -2)


def _svd_reference(np, a, full_matrices=True, compute_uv=True):
    if not compute_uv:
        return np.linalg.svd(a, full_matrices=False, compute_uv=False)
    return tuple(np.linalg.svd(a, full_matrices=full_matrices))


def _sample_svd_call(draw):
    args, _ = _sample_svd(draw)
    return args, {"full_matrices": False, "compute_uv": draw.boolean()}


@numpy_rule(np.linalg.svd, sample=_sample_svd_call, reference=_svd_reference)
def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """The reduced SVD ``(U, S, Vh)`` of each matrix, as NumPy's ``SVDResult``
    (``compute_uv=False``: the singular values).  Composed from
    ``svd_packed``.  ``full_matrices=True`` (NumPy's default) is refused for
    non-square matrices -- the extra columns of ``U`` or ``Vh`` are not
    unique, so no derivative exists: pass ``full_matrices=False``;
    ``hermitian=True`` is refused too."""
    if hermitian:
        raise UnimplementedError("svd(..., hermitian=True) is not supported: use eigh")
    a = _as_array(a)
    shape = _shape(_raw(a))
    if len(shape) < 2:
        raise ValidationError(f"svd needs matrices (shape (..., m, n)), got {tuple(shape)}")
    m, n = shape[-2], shape[-1]
    if compute_uv and full_matrices and m != n:
        raise UnimplementedError(
            f"svd(full_matrices=True) of a {m}x{n} matrix: the extra singular vectors are "
            "not unique, so they have no derivative; pass full_matrices=False")
    u, s, v = _svd_parts(recordable, svd_packed(a), m)
    if not compute_uv:
        return s
    return SVDResult(u, s, _mT(recordable, v))


def _svdvals_reference(np, a):
    return np.linalg.svd(a, full_matrices=False, compute_uv=False)


@numpy_rule(*([np.linalg.svdvals] if hasattr(np.linalg, "svdvals") else []),
            sample=_sample_svd, reference=_svdvals_reference)
def svdvals(a):
    """The singular values of each matrix, descending: ``svd(a,
    compute_uv=False)``.  The gradient at repeated singular values exists
    only for equal cotangents (a symmetric function of them)."""
    return svd(a, full_matrices=False, compute_uv=False)


# =====================================================================================
# Norms
# =====================================================================================


def _l2_prepare(x, axis=None, keepdims=False):
    return x, axis_param(axis), bool(keepdims)


def _keepdims_shape(shape, axis):
    axes = norm_axes(axis, len(shape))
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _sample_l2(draw):
    shape = draw.shape(min_side=0)
    return [draw.array(shape)], {"axis": draw.axis(len(shape)), "keepdims": draw.boolean()}


@op(sample=_sample_l2, reference=lambda np, x, axis=None, keepdims=False: np.sqrt(
    np.sum(x * x, axis=axis, keepdims=keepdims)))
class l2_norm:
    """``sqrt(sum(x**2, axis))``: the 2-norm of vectors, the Frobenius norm of
    matrices.  At 0 the gradient is 0 (the least-norm subgradient, as ``abs``;
    JAX gives NaN)."""
    def kernel(x, axis, keepdims):
        xp = array_module(x)
        return xp.sqrt(xp.sum(x * x, axis=axis, keepdims=keepdims))

    prepare = _l2_prepare

    def vjp_x(o, g, out, x, axis, keepdims):
        shape = tuple(x.shape)
        kept = _keepdims_shape(shape, axis)
        zero = array_module(_raw(out)).reshape(_raw(out), kept) == 0
        scale = o.div(o.reshape(g, kept), o.where(zero, 1.0, o.reshape(out, kept)))
        return o.mul(x, o.where(zero, 0.0, scale))

    def jvp_x(o, t, out, x, axis, keepdims):
        zero = _raw(out) == 0
        dot = o.sum(o.mul(x, t), axis, keepdims)
        return o.where(zero, 0.0, o.div(dot, o.where(zero, 1.0, out)))


def _vector_norm(x, ord, axis, keepdims):
    rx = _raw(x)
    if ord is None or ord == 2:
        return l2_norm(x, axis, keepdims)
    if isinstance(ord, str):
        raise ValidationError(f"norm: ord={ord!r} is for matrices, not vectors")
    if ord == math.inf:
        return _max(_abs(x), axis, keepdims)
    if ord == -math.inf:
        return _min(_abs(x), axis, keepdims)
    if ord == 0:     # a count: piecewise constant, no derivative
        xp = array_module(rx)
        count = xp.sum(rx != 0, axis=axis, keepdims=keepdims).astype(_dtype(rx))
        return Tensor(count) if isinstance(x, Tensor) else count
    if ord == 1:
        return _sum(_abs(x), axis, keepdims)
    p = float(ord)
    return _sum(_abs(x) ** p, axis, keepdims) ** (1.0 / p)


def _matrix_norm(x, ord, axes, keepdims):
    row, col = axes
    if ord is None or ord == "fro":
        result = l2_norm(x, (row, col), True)
    elif ord in ("nuc", 2, -2):
        s = svdvals(_moved_last(x, row, col))
        if ord == "nuc":
            result = _sum(s, -1, False)
        elif ord == 2:
            result = _max(s, -1, False)
        else:
            result = _min(s, -1, False)
        result = reshape(result, _keepdims_shape(_shape(_raw(x)), (row, col)))
    elif ord in (1, -1, math.inf, -math.inf):
        summed, reduced = (row, col) if ord in (1, -1) else (col, row)
        sums = _sum(_abs(x), summed, True)
        result = (_max if ord > 0 else _min)(sums, reduced, True)
    else:
        raise ValidationError(f"norm: invalid ord={ord!r} for matrices")
    if keepdims:
        return result
    return reshape(result, tuple(s for i, s in enumerate(_shape(_raw(result)))
                                 if i not in (row, col)))


def _moved_last(x, row, col):
    nd = len(_shape(_raw(x)))
    perm = tuple(i for i in range(nd) if i not in (row, col)) + (row, col)
    return x if perm == tuple(range(nd)) else transpose(x, perm)


def _sample_norm(draw):
    kind = draw.choice(["vector", "matrix", "all"])
    if kind == "all":
        shape = draw.shape(min_side=1)
        return [draw.array(shape, "away_from_zero")], {"keepdims": draw.boolean()}
    if kind == "vector":
        shape = draw.shape(min_dims=1)
        axis = draw.integers(-len(shape), len(shape) - 1)
        ord_ = draw.choice([None, 2, 1, 3, 0.5, math.inf, -math.inf])
        return [draw.array(shape, "away_from_zero")], {"ord": ord_, "axis": axis,
                                                       "keepdims": draw.boolean()}
    args, _ = _sample_svd(draw)
    x = args[0]
    nd = x.ndim
    axis = draw.choice([(nd - 2, nd - 1), (-1, -2)])
    ord_ = draw.choice([None, "fro", "nuc", 2, -2, 1, -1, math.inf, -math.inf])
    return [x], {"ord": ord_, "axis": axis, "keepdims": draw.boolean()}


def _norm_reference(np, x, ord=None, axis=None, keepdims=False):
    """The norms by their definitions (HIPS autograd's norm rule lacks most
    orders and keepdims)."""
    nd = np.ndim(x)
    if axis is None:
        if ord is None:
            return np.sqrt(np.sum(x * x, axis=None, keepdims=keepdims))
        axis = 0 if nd == 1 else (0, 1)
    if isinstance(axis, int) or len(axis) == 1:
        axis = axis if isinstance(axis, int) else axis[0]
        if ord is None or ord == 2:
            return np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims))
        if ord in (math.inf, -math.inf):
            return (np.max if ord > 0 else np.min)(np.abs(x), axis=axis, keepdims=keepdims)
        if ord == 0:
            return np.sum(x != 0, axis=axis, keepdims=keepdims).astype(x.dtype)
        return np.sum(np.abs(x) ** ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)
    row, col = (a % nd for a in axis)
    if ord in (None, "fro"):
        return np.sqrt(np.sum(x * x, axis=(row, col), keepdims=keepdims))
    if ord in ("nuc", 2, -2):
        s = np.linalg.svd(np.moveaxis(x, (row, col), (-2, -1)), compute_uv=False)
        r = {"nuc": np.sum, 2: np.max, -2: np.min}[ord](s, axis=-1)
        if keepdims:
            r = np.expand_dims(np.expand_dims(r, _pymin(row, col)), _pymax(row, col))
        return r
    summed, reduced = (row, col) if ord in (1, -1) else (col, row)
    pick = np.max if ord > 0 else np.min
    r = pick(np.sum(np.abs(x), axis=summed, keepdims=True), axis=reduced, keepdims=True)
    return r if keepdims else np.squeeze(r, axis=(row, col))


@numpy_rule(np.linalg.norm, sample=_sample_norm, reference=_norm_reference)
def norm(x, ord=None, axis=None, keepdims=False):
    """NumPy's ``linalg.norm``: vector norms over one axis (``ord`` None/2,
    1, inf, -inf, 0 -- a count, no derivative -- or any p), matrix norms over
    two (None/'fro', 'nuc', 2, -2 through the singular values, 1, -1, inf,
    -inf), and with ``axis=None`` the 2-norm of the flattened array (or the
    vector/matrix norm for 1-D/2-D with ``ord``); ``keepdims`` as NumPy.
    Composed from ``l2_norm``, ``abs``, ``sum``, ``max``/``min``, ``pow``
    and ``svdvals``.  The 2-norm's gradient at 0 is 0; a p-norm's (p != 2)
    at the zero vector is NaN."""
    x = _as_array(x)
    nd = len(_shape(_raw(x)))
    if axis is None:
        if ord is None:
            return l2_norm(x, None, keepdims)
        if nd == 1:
            return _vector_norm(x, ord, 0, keepdims)
        if nd == 2:
            return _matrix_norm(x, ord, (0, 1), keepdims)
        raise ValidationError(f"norm: ord={ord!r} needs a 1-D or 2-D array or an axis")
    if isinstance(axis, (int, np.integer)):
        return _vector_norm(x, ord, gpu_ops.normalize_axis(int(axis), nd), keepdims)
    axes = tuple(gpu_ops.normalize_axis(_operator.index(a), nd) for a in axis)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes[0], keepdims)
    if len(axes) == 2 and axes[0] != axes[1]:
        return _matrix_norm(x, ord, axes, keepdims)
    raise ValidationError(f"norm: axis={axis!r} must name one or two distinct axes")

