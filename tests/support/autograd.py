"""Helpers of the autograd tests: the ``draw`` object the ops' sample domains
use (kina_fx.autograd.samples; hypothesis for shapes and choices, a seeded NumPy
generator for values), and a NumPy-backed stand-in for CuPy."""
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kina_fx import gpu_ops


class Draw:
    def __init__(self, data, rng):
        self.data = data
        self.rng = rng

    def shape(self, min_dims=0, max_dims=3, min_side=1, max_side=3):
        return self.data.draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims,
                                               min_side=min_side, max_side=max_side))

    def broadcastable(self, n, min_dims=0, max_dims=3, min_side=1, max_side=3):
        shapes = self.data.draw(hnp.mutually_broadcastable_shapes(
            num_shapes=n, min_dims=min_dims, max_dims=max_dims, min_side=min_side,
            max_side=max_side))
        return list(shapes.input_shapes)

    def integers(self, lo, hi):
        return self.data.draw(st.integers(lo, hi))

    def choice(self, options):
        return self.data.draw(st.sampled_from(list(options)))

    def boolean(self):
        return self.data.draw(st.booleans())

    def axis(self, ndim, multiple=True, none=True):
        if ndim == 0:
            return None
        options = [st.integers(-ndim, ndim - 1)]
        if none:
            options.append(st.none())
        if multiple:
            options.append(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim,
                                    unique=True).map(
                lambda axes: tuple(a - ndim if i % 2 else a for i, a in enumerate(axes))))
        return self.data.draw(st.one_of(*options))

    def array(self, shape, domain="real"):
        rng = self.rng
        if domain == "real":
            x = rng.standard_normal(shape)
        elif domain == "positive":
            x = np.abs(rng.standard_normal(shape)) + 0.5
        elif domain == "away_from_zero":
            x = rng.standard_normal(shape)
            x = np.where(x >= 0, x + 0.2, x - 0.2)
        elif domain == "unit":
            x = rng.uniform(-0.9, 0.9, shape)
        elif domain == "above_one":
            x = 1.2 + np.abs(rng.standard_normal(shape))
        else:
            raise ValueError(f"unknown sample domain {domain!r}")
        return np.asarray(x, dtype=np.float64)

    def integer_array(self, shape, lo, hi):
        return self.rng.integers(lo, hi + 1, size=shape)

    def bool_array(self, shape):
        return self.rng.random(shape) > 0.5


class RandomDraw(Draw):
    """The same interface without hypothesis: every choice from a seeded NumPy
    generator (many draws cheaply, no shrinking), for tests that survey what
    a sample domain draws."""

    def __init__(self, rng):
        super().__init__(None, rng)

    def shape(self, min_dims=0, max_dims=3, min_side=1, max_side=3):
        ndim = self.integers(min_dims, max_dims)
        return tuple(self.integers(min_side, max_side) for _ in range(ndim))

    def broadcastable(self, n, min_dims=0, max_dims=3, min_side=1, max_side=3):
        base = self.shape(min_dims, max_dims, min_side, max_side)
        shapes = []
        for _ in range(n):
            shape = base[self.integers(0, len(base) - min_dims):]
            shapes.append(tuple(1 if self.boolean() and self.boolean() else s for s in shape))
        return shapes

    def integers(self, lo, hi):
        return int(self.rng.integers(lo, hi + 1))

    def choice(self, options):
        options = list(options)
        return options[self.integers(0, len(options) - 1)]

    def boolean(self):
        return bool(self.rng.integers(0, 2))

    def axis(self, ndim, multiple=True, none=True):
        if ndim == 0:
            return None
        kinds = ["int"] + (["none"] if none else []) + (["tuple"] if multiple else [])
        kind = self.choice(kinds)
        if kind == "none":
            return None
        if kind == "int":
            return self.integers(-ndim, ndim - 1)
        axes = self.rng.permutation(ndim)[:self.integers(1, ndim)]
        return tuple(int(a) - ndim if i % 2 else int(a) for i, a in enumerate(axes))


def differentiable_leaves(args):
    """Positions of the float64 arrays among ``args`` (also inside a list in
    first position, for sequence ops): ``[(k, None) or (0, j)]``."""
    where = []
    for k, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.dtype == np.float64:
            where.append((k, None))
        elif k == 0 and isinstance(a, list):
            where.extend((0, j) for j, x in enumerate(a)
                         if isinstance(x, np.ndarray) and x.dtype == np.float64)
    return where


def with_leaves(args, where, leaves):
    """``args`` with the differentiable leaves replaced."""
    args = list(args)
    if args and isinstance(args[0], list):
        args[0] = list(args[0])
    for (k, j), leaf in zip(where, leaves):
        if j is None:
            args[k] = leaf
        else:
            args[0][j] = leaf
    return args


def args_on_device(args):
    """Every NumPy array among ``args`` (also in a list) moved to the stand-in device."""
    return [[on_device(x) for x in a] if isinstance(a, list) else on_device(a) for a in args]


def leaves_of(args, where):
    return [args[k] if j is None else args[0][j] for k, j in where]


# --- the CuPy code path without a GPU: a NumPy-backed stand-in for CuPy ----------------


class FakeDeviceArray(np.ndarray):
    """Stands for cupy.ndarray: a NumPy array of another class, with .get()."""

    def get(self):
        return np.asarray(self).view(np.ndarray)


def on_device(value):
    if isinstance(value, np.ndarray):
        return value.view(FakeDeviceArray)
    if isinstance(value, np.generic):
        return np.asarray(value).view(FakeDeviceArray)
    return value


class FakeCupy:
    """The array-module surface kina_fx.autograd uses; results stay 'on device'."""

    ndarray = FakeDeviceArray
    __name__ = "fake_cupy"

    def __init__(self):
        self.__dict__["calls"] = set()

    def __getattr__(self, name):
        self.calls.add(name)
        fn = getattr(np, name)
        if name == "linalg":
            return _FakeLinalg(self)
        if not callable(fn):
            return fn

        def call_on_device(*args, **kwargs):
            return on_device(fn(*args, **kwargs))
        return call_on_device


class _FakeLinalg:
    """cupy.linalg's stand-in: numpy.linalg with results 'on device'."""

    def __init__(self, cupy):
        self._cupy = cupy

    def __getattr__(self, name):
        self._cupy.calls.add("linalg." + name)
        fn = getattr(np.linalg, name)

        def call_on_device(*args, **kwargs):
            r = fn(*args, **kwargs)
            if isinstance(r, tuple):         # (named) tuples of results: each on device
                parts = [on_device(np.asarray(v)) for v in r]
                return type(r)(*parts) if hasattr(r, "_fields") else tuple(parts)
            return on_device(np.asarray(r))
        return call_on_device


@pytest.fixture
def fake_cupy(monkeypatch):
    import sys
    import types
    fake = FakeCupy()
    monkeypatch.setattr(gpu_ops, "_cupy", fake)
    cupyx = types.ModuleType("cupyx")
    cupyx.scatter_add = lambda z, index, g: np.add.at(z, index, g)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    return fake
