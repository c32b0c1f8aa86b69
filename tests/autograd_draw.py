"""The ``draw`` object the ops' sample domains use (kina_fx.autograd.samples),
backed by hypothesis for shapes and choices and a seeded NumPy generator for
values."""
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


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


def leaves_of(args, where):
    return [args[k] if j is None else args[0][j] for k, j in where]
