"""Pytrees: tuples, lists, dicts (and namedtuples) of leaves, as JAX has them.

``None`` is an empty node; every other value is a leaf.
"""
from __future__ import annotations

import numpy as np

from .tensor import Tensor

__all__ = ["flatten", "has_tensor", "leaf_rebuild"]

_ndarray = np.ndarray


def leaf_rebuild(ls):
    """``flatten``'s rebuild of a tree that is one leaf."""
    return ls[0]


def has_tensor(tree) -> bool:
    """Whether a pytree holds a Tensor leaf (then outputs are Tensors too)."""
    cls = tree.__class__
    if cls is Tensor:
        return True
    if cls is _ndarray:
        return False
    if isinstance(tree, (tuple, list)):
        return any(has_tensor(c) for c in tree)
    if isinstance(tree, dict):
        return any(has_tensor(c) for c in tree.values())
    return False


def flatten(tree):
    """(leaves, rebuild): ``rebuild(leaves)`` makes a tree of the same structure."""
    cls = tree.__class__
    if cls is _ndarray or cls is Tensor or cls is float:
        return [tree], leaf_rebuild
    if isinstance(tree, (tuple, list)):
        parts = [flatten(c) for c in tree]
        leaves = [leaf for ls, _ in parts for leaf in ls]
        counts = [len(ls) for ls, _ in parts]
        kind = type(tree)

        def rebuild(ls):
            out, k = [], 0
            for (_, rb), n in zip(parts, counts):
                out.append(rb(ls[k:k + n]))
                k += n
            if kind is list:
                return out
            if kind is tuple:
                return tuple(out)
            return kind(*out) if hasattr(kind, "_fields") else kind(out)
        return leaves, rebuild
    if isinstance(tree, dict):
        keys = list(tree)
        leaves, rb = flatten([tree[k] for k in keys])
        kind = type(tree)
        return leaves, lambda ls: kind(zip(keys, rb(ls)))
    if tree is None:
        return [], lambda ls: None
    return [tree], leaf_rebuild
