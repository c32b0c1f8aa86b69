"""Which effects a function may perform, declared or found, and which of them a
set of handlers leaves unhandled: checking coverage before running.

* ``@performs(e1, e2)`` declares a function's effects.  The declaration is
  trusted as complete: :func:`effects` does not look inside a declared
  function.  It adds nothing to calls (the function is returned unchanged).
* :func:`effects` ``(fn)`` is the declared set if there is one; otherwise it
  is found from ``fn``'s code, transitively: the effects its code refers to by
  name (globals, closure variables, default arguments; ``perform(E, ...)`` and
  ``E(...)`` both name ``E``), plus the effects of the functions it refers to
  the same way (``helper()``, ``module.helper()``, ``functools.partial``,
  bound methods), recursively.
* :func:`unhandled_effects` ``(fn, *handlers)`` is ``effects(fn)`` minus what
  the handlers handle and minus effects that have a ``default``.

What is found is an over-approximation of what the code *names*, not of what
it does: an effect only mentioned (to build a handler for it, say) counts; an
effect reached through something the code does not name (a callback passed as
an argument, a method of an object it receives, code in C) is not seen.
Declare such functions with :func:`performs`.
"""
from __future__ import annotations

import builtins
import functools
import types
from typing import Any, Callable, FrozenSet, TypeVar

from .handlers import Effect

__all__ = ["performs", "effects", "unhandled_effects", "handled_by"]

F = TypeVar("F", bound=Callable[..., Any])

_DECLARED = "__kina_performs__"


def performs(*declared: Effect) -> Callable[[F], F]:
    """Declare the effects a function may perform (its whole set, effects of its
    callees included); :func:`effects` trusts the declaration."""
    for effect in declared:
        if not isinstance(effect, Effect):
            raise TypeError(f"performs() takes Effect instances, not {effect!r}")
    effect_set = frozenset(declared)

    def declare(fn: F) -> F:
        target = getattr(fn, "__func__", fn)     # staticmethod / classmethod / bound method
        try:
            setattr(target, _DECLARED, effect_set)
        except (AttributeError, TypeError):
            raise TypeError(f"cannot declare the effects of {fn!r}: it takes no attributes") from None
        return fn
    return declare


def declared_effects(fn) -> "FrozenSet[Effect] | None":
    """The set ``@performs`` declared for ``fn``, or None."""
    return getattr(getattr(fn, "__func__", fn), _DECLARED, None)


def effects(fn) -> FrozenSet[Effect]:
    """The effects ``fn`` may perform (see the module docstring)."""
    found: set = set()
    _collect(fn, found, set())
    return frozenset(found)


def handled_by(handler) -> FrozenSet[Effect]:
    """The effects ``handler`` has a clause for (a Handler, a MultiHandler, or
    anything with a ``handles()`` method)."""
    if hasattr(handler, "handles"):
        return frozenset(handler.handles())
    try:
        return frozenset(handler.on) | frozenset(handler.fun)
    except (AttributeError, TypeError):
        raise TypeError(f"not a handler: {handler!r}") from None


def unhandled_effects(fn, *handlers) -> FrozenSet[Effect]:
    """The effects ``fn`` may perform that none of ``handlers`` handles and that
    have no ``default``: what would raise Unhandled."""
    covered: set = set()
    for h in handlers:
        covered |= handled_by(h)
    return frozenset(e for e in effects(fn) if e not in covered and e.default is None)


def _collect(obj, found, seen):
    if isinstance(obj, Effect):
        found.add(obj)
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    declared = declared_effects(obj) if callable(obj) else None
    if declared is not None:
        found.update(declared)
        return
    if isinstance(obj, functools.partial):
        for part in (obj.func, *obj.args, *obj.keywords.values()):
            _collect(part, found, seen)
        return
    if isinstance(obj, types.MethodType):
        _collect(obj.__func__, found, seen)
        return
    if isinstance(obj, (staticmethod, classmethod)):
        _collect(obj.__func__, found, seen)
        return
    if not isinstance(obj, types.FunctionType):
        return                                # a class, a C function, data: not looked into
    scope = obj.__globals__
    for value in (*(c.cell_contents for c in obj.__closure__ or () if _filled(c)),
                  *(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()):
        _collect(value, found, seen)
    for code in _codes(obj.__code__):
        modules = []
        for name in code.co_names:
            value = scope.get(name, _MISSING)
            if value is _MISSING:
                value = getattr(builtins, name, _MISSING)
            if value is _MISSING:
                continue
            if isinstance(value, types.ModuleType):
                modules.append(value)
            else:
                _collect(value, found, seen)
        # ``module.name``: the names the code loads as attributes, looked up in
        # the modules it names (an over-approximation of which it reaches).
        for module in modules:
            for name in code.co_names:
                value = getattr(module, name, _MISSING)
                if value is not _MISSING and not isinstance(value, types.ModuleType):
                    _collect(value, found, seen)


_MISSING = object()


def _filled(cell):
    try:
        cell.cell_contents
    except ValueError:                        # an empty cell
        return False
    return True


def _codes(code):
    """``code`` and the code objects nested in it (lambdas, comprehensions, inner defs)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)
