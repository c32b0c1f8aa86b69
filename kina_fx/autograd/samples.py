"""Sample domains: how the generic tests draw valid inputs for an op.

Each op registers ``sample=``: a function ``sample(draw) -> (args, kwargs)``
giving one valid call of the op's public function.  ``draw`` is supplied by
the tests (backed by hypothesis; this module never imports it) and offers:

* ``draw.shape(min_dims=0, max_dims=3, min_side=1, max_side=3)``
* ``draw.broadcastable(n, min_dims=0, max_dims=3, min_side=1, max_side=3)``: n
  mutually broadcastable shapes
* ``draw.integers(lo, hi)``, ``draw.choice(options)``, ``draw.boolean()``
* ``draw.axis(ndim, multiple=True, none=True)``: None, an axis or a tuple of
  axes (negative ones too)
* ``draw.array(shape, domain="real")``: float64 values in ``domain``, one of
  ``DOMAINS``
* ``draw.integer_array(shape, lo, hi)``, ``draw.bool_array(shape)``

Array arguments that are float64 ndarrays (also inside a list argument of a
sequence op) are the ones the tests differentiate with respect to; the others
are held fixed.  Values are drawn away from kinks, ties and singularities of
their domain, since the tests compare against finite differences.
"""
from __future__ import annotations

#: name -> (description): the value domains ``draw.array`` understands.
DOMAINS = {
    "real": "standard normal",
    "positive": "|standard normal| + 0.5",
    "away_from_zero": "standard normal moved 0.2 away from 0",
    "unit": "uniform in (-0.9, 0.9)",
    "above_one": "1.2 + |standard normal|",
}


def elementwise(*domains, empty=True):
    """An elementwise op of ``len(domains)`` (default 1) broadcasting arrays."""
    domains = domains or ("real",)

    def sample(draw):
        shapes = draw.broadcastable(len(domains), min_side=0 if empty else 1)
        return [draw.array(s, d) for s, d in zip(shapes, domains)], {}
    return sample


def reduction(domain="real", empty=False):
    """A reduction ``f(x, axis=..., keepdims=...)``."""
    def sample(draw):
        shape = draw.shape(min_side=0 if empty else 1)
        return [draw.array(shape, domain)], {"axis": draw.axis(len(shape)),
                                             "keepdims": draw.boolean()}
    return sample


def along_axis(domain="real"):
    """``f(x, axis=k)`` with a single axis."""
    def sample(draw):
        shape = draw.shape(min_dims=1)
        return [draw.array(shape, domain)], {"axis": draw.integers(-len(shape),
                                                                   len(shape) - 1)}
    return sample
