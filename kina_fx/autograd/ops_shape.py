"""Breadth ops (shape): one `@op` block each (docs/autograd.md, "How to add an op").

Every public name listed in `__all__` here is re-exported by
`kina_fx.autograd`.
"""
from __future__ import annotations

__all__: list = []
