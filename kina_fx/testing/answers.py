"""What a script may answer a perform with, and how each answer is given.

========================  ==============================================================
script entry              the perform's answer
========================  ==============================================================
a plain value             the value itself
a callable                called with the perform's arguments; its result (the
                          callable's arity is checked first: a mismatch fails the test,
                          naming the effect)
an ``async def`` callable called, and its coroutine awaited on the running event loop
                          (through :func:`kina_fx.aio.await_only`: the code must run
                          under ``kina_fx.aio.run``); so is a coroutine that a plain
                          callable returns
:func:`returns` ``(x)``   ``x`` as it is, even when it is callable (a class, a function)
:func:`sequence` ``(...)``  one of its answers per perform, in turn (each of them any of
                          these); one perform too many fails the test
:func:`raises` ``(exc)``  ``exc`` raised at the perform (a class is instantiated anew
                          each time)
:data:`OUTER`             recorded, then left to the handlers outside
========================  ==============================================================
"""
from __future__ import annotations

import inspect
from typing import Any
from unittest.mock import ANY

from .. import aio
from ..errors import ValidationError
from ..handlers import Effect, perform
from . import describe, spec
from .failures import fail

__tracebackhide__ = True

__all__ = ["sequence", "raises", "returns", "OUTER", "ANY"]


class Sequence:
    """Answers given in turn, one per perform (see :func:`sequence`)."""

    def __init__(self, answers):
        self.answers = tuple(answers)
        self.given = 0

    def next_answer(self, effect, args, earlier, raised):
        """The next answer; one perform too many fails the test (``earlier``:
        the effect's performs before this one)."""
        if self.given >= len(self.answers):
            before = ", ".join(describe.call(effect, a) for a in earlier[-5:])
            more = f" (the last 5 of {len(earlier)})" if len(earlier) > 5 else ""
            fail(f"{effect.name} was performed a {describe.ordinal(len(earlier) + 1)} time, "
                 f"but its script {self!r} has {describe.plural(len(self.answers), 'answer')}\n"
                 f"  this perform: {describe.call(effect, args)}\n"
                 f"  performed before{more}: {before or 'nothing'}", raised)
        answer = self.answers[self.given]
        self.given += 1
        return answer

    def __repr__(self):
        return f"sequence({', '.join(map(describe.short_repr, self.answers))})"


class Raises:
    """An exception raised at the perform (see :func:`raises`)."""

    def __init__(self, exc):
        self.exc = exc

    def __repr__(self):
        return f"raises({self.exc.__name__ if isinstance(self.exc, type) else describe.short_repr(self.exc)})"


class Returns:
    """A value answered as it is, callable or not (see :func:`returns`)."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"returns({describe.short_repr(self.value)})"


class _Outer:
    def __repr__(self):
        return "OUTER"


#: Script answer: record the perform, then let the handlers outside answer it.
OUTER: Any = _Outer()


def sequence(*answers) -> Sequence:
    """Script answers given in turn, one per perform (each may itself be a
    value, a callable, :func:`returns`, :func:`raises` or :data:`OUTER`); one
    perform too many fails the test."""
    return Sequence(answers)


def raises(exc) -> Raises:
    """Script an exception (instance or class) raised at the perform."""
    if not (isinstance(exc, BaseException) or (isinstance(exc, type) and issubclass(exc, BaseException))):
        raise TypeError(f"raises() needs an exception, not {exc!r}")
    return Raises(exc)


def returns(value) -> Returns:
    """Script ``value`` as the answer, as it is: ``{NewId: returns(str)}``
    answers the class ``str`` itself, where ``{NewId: str}`` would call it."""
    return Returns(value)


def is_called(answer) -> bool:
    """Whether a script entry is called to get the answer (module docstring)."""
    return callable(answer) and not isinstance(answer, (Effect, Sequence, Raises, Returns, _Outer))


def give(answer, effect, args, effect_type, raised):
    """The answer to one perform of ``effect`` (a sequence's turn already taken)."""
    if answer is OUTER:
        return perform(effect, *args)      # a fun clause runs outside its handler
    if isinstance(answer, Raises):
        exc = answer.exc
        raise exc() if isinstance(exc, type) else exc
    if isinstance(answer, Returns):
        return answer.value
    if not is_called(answer):
        return answer
    refused = spec.can_take(answer, len(args))
    if refused is not None:
        fail(f"the script's answer for {effect.name}, {spec.where_defined(answer)}, cannot take "
             f"the perform's {describe.plural(len(args), 'argument')} {describe.call(effect, args)}: "
             f"{refused}\n  (to answer with the callable itself, script returns({_name(answer)}))",
             raised)
    result = answer(*args)
    if inspect.iscoroutine(result):
        result = _awaited(result, answer, effect, raised)
    if effect_type is not None and not spec.conforms(result, effect_type.answer):
        hint = (f"\n  (to answer with the callable itself, script returns({_name(answer)}))"
                if spec.conforms(answer, effect_type.answer) else "")
        fail(f"the script's answer for {effect.name}, {spec.where_defined(answer)}, returned "
             f"{describe.short_repr(result)} ({type(result).__name__}), but {effect.name} answers "
             f"{spec.type_name(effect_type.answer)} ({effect_type.describe()}){hint}", raised)
    return result


def _awaited(coroutine, answer, effect, raised):
    """Await ``coroutine`` on the running event loop, from the code under test."""
    started = []

    async def awaiting():
        started.append(True)
        return await coroutine
    try:
        return aio.await_only(awaiting())
    except ValidationError:
        if started:               # the answer's own ValidationError
            raise
    coroutine.close()             # never awaited: no warning about it later
    fail(f"the script's answer for {effect.name}, {spec.where_defined(answer)}, is async: it is "
         "awaited on the running event loop, so the code that performs it must run under "
         "kina_fx.aio.run(): `await aio.run(fn, *args, handlers=[mock])` or "
         "`await mock.run_async(fn, *args)`", raised)


def _name(answer) -> str:
    return getattr(answer, "__qualname__", None) or describe.short_repr(answer)
