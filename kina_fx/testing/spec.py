"""What the kit knows of an effect's signature: mock's ``autospec``, for effects.

An effect is typed for type checkers (``Ask: Effect[[str, int], bool] =
Effect("ask")``, docs/effects.md); at run time ``Effect("ask")`` knows
nothing of it.  The kit finds the declaration where a module of the running
program makes it: a module-level variable annotated ``Effect[[...], R]`` whose
value is the effect (string annotations, ``from __future__ import
annotations``, are evaluated in their module).  Failing that, an effect's
``default`` gives the number of its parameters.  ``Effect[..., R]`` knows the
answer's type and not the parameters.

What is checked, where known (docs/testing.md, "Checked scripts"):

* each scripted answer that is a value is an instance of the answer type,
  when the ``ScriptedHandler`` is made; a callable answer can take the
  effect's parameters, then too;
* each perform passes as many arguments as the effect has parameters, and the
  value a callable answer returns is an instance of the answer type, at the
  perform (a failure of the test, naming the effect).

Types are checked as far as ``isinstance`` can: classes (``int`` is accepted
for ``float``, as type checkers do), ``None``, unions and ``Optional``,
``Literal``, and the class of a generic (``list[int]`` as ``list``,
``Callable[...]`` as ``callable``); ``Any``, type variables, protocols that are
not runtime-checkable and the like accept everything.
"""
from __future__ import annotations

import collections.abc
import inspect
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Optional

from ..handlers import Effect

__tracebackhide__ = True

_ANYTHING = object()    # a parameter list the declaration leaves open (``...``, a ParamSpec)


@dataclass(frozen=True)
class EffectType:
    """An effect's known signature: parameter types (None: not known) and answer type."""

    params: Optional[tuple]
    answer: Any               # a type, or _ANYTHING
    declared: str             # where it was found, for messages

    def describe(self) -> str:
        return self.declared


def effect_type(effect: Effect) -> Optional[EffectType]:
    """The signature of ``effect`` found in the program, or None."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        annotations = namespace.get("__annotations__") if isinstance(namespace, dict) else None
        if not isinstance(annotations, dict):
            continue
        for name, annotation in list(annotations.items()):
            if namespace.get(name) is effect:
                found = _from_annotation(annotation, namespace)
                if found is not None:
                    params, answer = found
                    shown = ("..." if params is None
                             else "[" + ", ".join(map(type_name, params)) + "]")
                    return EffectType(params, answer, f"{name}: Effect[{shown}, {type_name(answer)}] "
                                                      f"in {module.__name__}")
    default = getattr(effect, "default", None)
    if default is not None:
        params = _positional_count(default)
        if params is not None:
            return EffectType((_ANYTHING,) * params, _ANYTHING,
                              f"its default {getattr(default, '__qualname__', default)!r}")
    return None


def _from_annotation(annotation, namespace):
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, namespace)   # noqa: S307 - the module's own annotation
        except Exception:
            return None
    if typing.get_origin(annotation) is not Effect:
        return None
    args = typing.get_args(annotation)
    if len(args) != 2:
        return None
    params, answer = args
    if isinstance(params, (list, tuple)):
        params = tuple(params)
    else:                     # ``...`` or a ParamSpec: any parameters
        params = None
    return params, answer




def _positional_count(fn) -> Optional[int]:
    """How many positional arguments ``fn`` takes, if that is one number."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL or p.default is not p.empty for p in parameters):
        return None               # several counts are right
    return len(positional)


def type_name(tp) -> str:
    if tp is _ANYTHING:
        return "anything"
    if tp is None or tp is type(None):
        return "None"
    if isinstance(tp, type) and typing.get_origin(tp) is None:
        return tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
    return repr(tp).replace("typing.", "")


def conforms(value, tp) -> bool:
    """``value`` is an instance of the type ``tp`` as far as the kit checks (module docstring)."""
    if tp is _ANYTHING or tp is Any or tp is object:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is getattr(types, "UnionType")):
        return any(conforms(value, arg) for arg in typing.get_args(tp))
    if origin is typing.Literal:
        return any(value == arg for arg in typing.get_args(tp))
    if origin is typing.Annotated:
        return conforms(value, typing.get_args(tp)[0])
    if origin is collections.abc.Callable:
        return callable(value)
    if origin is not None:
        tp = origin
    if isinstance(tp, type):
        if tp is float and isinstance(value, int):
            return True
        if tp is complex and isinstance(value, (int, float)):
            return True
        try:
            return isinstance(value, tp)
        except TypeError:         # a protocol that is not runtime-checkable
            return True
    supertype = getattr(tp, "__supertype__", None)          # typing.NewType
    if supertype is not None:
        return conforms(value, supertype)
    return True                   # a TypeVar, a forward reference...: not checked


def can_take(fn, count: int) -> Optional[str]:
    """None when ``fn`` can be called with ``count`` positional arguments,
    else why not (inspect's words); None as well when its signature is unknown."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(count))
    except TypeError as exc:
        return str(exc)
    return None


def where_defined(fn) -> str:
    """``name (file:line)`` of a function, or its repr."""
    code = getattr(inspect.unwrap(fn) if callable(fn) else fn, "__code__", None)
    name = getattr(fn, "__qualname__", None) or repr(fn)
    if code is None:
        return name
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
