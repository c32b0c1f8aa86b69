"""ScriptedHandler: a handler that answers effects from a script and records every perform.

Recording under multi-shot replay.  A ``MultiHandler`` (kina_fx.multishot)
makes the later shots of a continuation by running its body again from the
start, answering the replayed performs from its record.  A ScriptedHandler
installed *inside* such a body would see every replayed perform again: each
perform would be recorded once per replay, and a :func:`sequence` would move
on at each.  So inside such a body (``multishot.under_multihandler()``) the
recording step of a scripted answer (append to ``calls``, take a sequence's
turn, check the arguments) is itself a perform, of a private effect whose
``default`` does it: the ``MultiHandler`` records its result like any effect
that it forwards, and its replays answer it from the record without running
it again.  Elsewhere the step is a plain call.  Each perform is then recorded
once per shot the user sees: once for the performs before the point a
continuation was captured at, once per shot for those after.  The answer
itself (a callable, ``OUTER``...) is given at the perform, in every run,
replays included: it must be deterministic, as the body itself must.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import aio
from ..handlers import Effect, Handler, perform
from ..multishot import under_multihandler
from . import describe, spec
from .answers import OUTER, Raises, Returns, Sequence, give, is_called
from .failures import fail, pending

__tracebackhide__ = True

__all__ = ["ScriptedHandler", "Performed"]


@dataclass(frozen=True, eq=False)
class Performed:
    """One recorded perform: the effect and the tuple of its arguments.

    Equal to another ``Performed`` of the same effect whose arguments are
    equal (matchers such as ``ANY`` and ``pytest.approx`` included)."""

    effect: Effect
    args: tuple

    def __eq__(self, other):
        if not isinstance(other, Performed):
            return NotImplemented
        return self.effect is other.effect and describe.args_match(other.args, self.args)

    def __hash__(self):
        return hash((self.effect, self.args))

    def __repr__(self):
        return describe.call(self.effect, self.args)


# The recording step of every scripted answer (module docstring): performed by
# the clause, answered by its default unless a MultiHandler's record answers it.
_RECORD: Effect = Effect("kina.testing.record")
_RECORD.default = lambda handler, effect, args: handler._take_turn(effect, args)


class ScriptedHandler(Handler):
    """A handler that answers effects from a script and records every perform.

    ``ScriptedHandler({Get: 5, Fetch: lambda url: "<page>", Ask: sequence("y", "n"),
    Boom: raises(KeyError), Log: OUTER, NewId: returns(str), Load: async_load})``
    (the answers: docs/testing.md, "Script answers").  Every answer
    is given in place (a ``fun`` clause), so the handler can be installed with
    ``with`` as well as used with ``run(fn, *args)`` (or ``await
    run_async(fn, *args)``, for code with async answers).  Effects not in the
    script are neither answered nor recorded.

    Where an effect's type is known (docs/testing.md, "Checked scripts"), the
    script is checked against it here (``TypeError``) and each perform at the perform.
    A failure at a perform (a sequence run out, an answer that cannot take the
    arguments) is a :class:`~kina_fx.testing.Failure`, which the code under
    test cannot swallow: if it catches it anyway, the failure is raised again
    when the ``with`` block or ``run`` ends.
    """

    __slots__ = ("script", "calls", "_types", "_raised")

    def __init__(self, script):
        script = dict(script)
        for effect in script:
            if not isinstance(effect, Effect):
                raise TypeError(f"script keys must be Effect instances, not {effect!r}")
        self.script = script
        self.calls: list[Performed] = []
        self._raised: list = []
        self._types = {effect: spec.effect_type(effect) for effect in script}
        for effect, answer in script.items():
            self._check_answer(effect, answer)
        super().__init__(fun={effect: self._clause(effect) for effect in script})

    def _check_answer(self, effect, answer):
        effect_type = self._types[effect]
        if effect_type is None:
            return
        for item in answer.answers if isinstance(answer, Sequence) else (answer,):
            if is_called(item):
                if effect_type.params is not None:
                    refused = spec.can_take(item, len(effect_type.params))
                    if refused is not None:
                        raise TypeError(
                            f"the script's answer for {effect.name}, {spec.where_defined(item)}, cannot "
                            f"take {effect.name}'s {describe.plural(len(effect_type.params), 'parameter')} "
                            f"({effect_type.describe()}): {refused}")
            elif item is not OUTER and not isinstance(item, Raises):
                value = item.value if isinstance(item, Returns) else item
                if spec.conforms(value, effect_type.answer):
                    continue
                raise TypeError(
                    f"the script answers {effect.name} with {describe.short_repr(value)} "
                    f"({type(value).__name__}), but {effect.name} answers "
                    f"{spec.type_name(effect_type.answer)} ({effect_type.describe()})")

    def _clause(self, effect):
        def clause(*args):
            if under_multihandler():
                answer = perform(_RECORD, self, effect, args)
            else:
                answer = self._take_turn(effect, args)
            return give(answer, effect, args, self._types[effect], self._raised)
        clause.__name__ = clause.__qualname__ = f"scripted_{effect.name}"
        return clause

    def _take_turn(self, effect, args):
        """Record one perform and choose its answer (a sequence's turn): the
        step a multi-shot replay does not repeat (module docstring)."""
        effect_type = self._types[effect]
        if effect_type is not None and effect_type.params is not None and len(args) != len(effect_type.params):
            fail(f"{describe.call(effect, args)}: {effect.name} takes "
                 f"{describe.plural(len(effect_type.params), 'argument')} "
                 f"({effect_type.describe()}), it was performed with {len(args)}", self._raised)
        earlier = self.performed(effect)
        self.calls.append(Performed(effect, args))
        answer = self.script[effect]
        while isinstance(answer, Sequence):
            answer = answer.next_answer(effect, args, earlier, self._raised)
        return answer

    # --- running ---------------------------------------------------------------

    def run(self, fn, *args):
        """Run ``fn(*args)`` under this handler; a kit failure the code
        swallowed is raised here when it returns."""
        try:
            result = super().run(fn, *args)
        except BaseException as exc:
            self._settle(exc)
            raise
        self._settle(None)
        return result

    def run_async(self, fn, *args):
        """A coroutine: ``fn(*args)`` run under this handler by
        :func:`kina_fx.aio.run`, so that async answers are awaited on the
        running loop (``fn`` may be a coroutine function)."""
        return aio.run(fn, *args, handlers=[self])

    def __exit__(self, exc_type, exc, traceback):
        super().__exit__(exc_type, exc, traceback)
        self._settle(exc)
        return False

    def _settle(self, leaving):
        """A block of this handler ends with ``leaving`` (None: it returned):
        the kit's failures raised in it are reported, now, if it swallowed them."""
        raised, self._raised[:] = list(self._raised), []
        if not raised:
            return
        if any(failure is leaving for failure in raised):
            pending.settle(raised)
        elif leaving is None or isinstance(leaving, Exception):
            pending.settle(raised)
            raise raised[0]
        # Else a BaseException is on its way out (an abort's Unwind, Ctrl-C):
        # it goes on, and the failures stay pending for the pytest plugin.

    # --- assertions ------------------------------------------------------------

    def performed(self, effect: Effect) -> list[tuple]:
        """The argument tuples of every perform of ``effect``, in order."""
        return [c.args for c in self.calls if c.effect is effect]

    def count(self, effect: Effect, *args) -> int:
        """How many times ``effect`` was performed (with ``args``, if given;
        compared with ``==``: matchers welcome)."""
        return sum(1 for c in self.calls if c.effect is effect
                   and (not args or describe.args_match(args, c.args)))

    def assert_performed(self, effect: Effect, *args) -> None:
        """``effect`` was performed at least once (with ``args``, if given)."""
        if not self.count(effect, *args):
            raise AssertionError(f"{self._what(effect, args)} was not performed"
                                 f"{self._closest(effect, args)}\n{self._log()}")

    def assert_not_performed(self, effect: Effect, *args) -> None:
        """``effect`` was never performed (with ``args``, if given)."""
        n = self.count(effect, *args)
        if n:
            raise AssertionError(f"{self._what(effect, args)} was performed {describe.times(n)}\n"
                                 f"{self._log()}")

    def assert_performed_times(self, effect: Effect, times: int, *args) -> None:
        """``effect`` was performed exactly ``times`` times (with ``args``, if given)."""
        n = self.count(effect, *args)
        if n != times:
            raise AssertionError(f"{self._what(effect, args)} was performed {describe.times(n)}, "
                                 f"expected {describe.times(times)}\n{self._log()}")

    def assert_order(self, *expected) -> None:
        """These performs happened in this order (others may come in between).

        Each item is an ``Effect`` (any arguments) or a tuple ``(effect, *args)``.
        """
        position = 0
        previous = None
        for item in expected:
            while position < len(self.calls) and not _matches(item, self.calls[position]):
                position += 1
            if position == len(self.calls):
                where = f" after {_describe(previous)} (#{found})" if previous is not None else ""
                raise AssertionError(
                    f"no {_describe(item)}{where}\n  expected in this order: "
                    f"{', '.join(map(_describe, expected))}\n{self._log()}")
            position += 1
            previous, found = item, position
        return None

    def assert_calls(self, *expected) -> None:
        """The performs were exactly these, in this order (items as for assert_order)."""
        calls = self.calls
        if len(expected) == len(calls) and all(map(_matches, expected, calls)):
            return
        for at, (item, call) in enumerate(zip(expected, calls), 1):
            if not _matches(item, call):
                first = f"#{at}: performed {call!r}, expected {_describe(item)}"
                break
        else:
            at = min(len(expected), len(calls)) + 1
            first = (f"#{at}: performed {calls[at - 1]!r}, expected nothing more" if len(calls) > len(expected)
                     else f"#{at}: expected {_describe(expected[at - 1])}, performed nothing more")
        lines = describe.diff(list(expected), calls, _matches, lambda x: x if isinstance(x, str) else
                              (repr(x) if isinstance(x, Performed) else _describe(x)))
        raise AssertionError(
            f"the performs differ from the expected ones ({len(calls)} performed, {len(expected)} "
            f"expected); first difference at {first}\n  diff (- expected, + performed):\n"
            + "\n".join(lines))

    def reset(self) -> None:
        """Forget the recorded performs (the script's sequences go on where they were)."""
        self.calls.clear()

    def _what(self, effect, args):
        what = describe.call(effect, args) if args else effect.name
        if effect not in self.script:
            what += (f" (not in this ScriptedHandler's script, so never recorded; it answers "
                     f"{', '.join(e.name for e in self.script) or 'nothing'})")
        return what

    def _closest(self, effect, args):
        performed = self.performed(effect)
        if not args or not performed:
            return ""
        shown = "; ".join(f"{describe.call(effect, a)}: {describe.first_difference(args, a)}"
                          for a in performed[:5])
        return f"; {effect.name} was performed {describe.times(len(performed))}: {shown}"

    def _log(self):
        if not self.calls:
            return "  performed: nothing"
        return "  performed:\n" + "\n".join(f"    #{i} {c!r}" for i, c in enumerate(self.calls, 1))

    def __repr__(self):
        return (f"<ScriptedHandler {', '.join(e.name for e in self.script)}: "
                f"{describe.plural(len(self.calls), 'perform')}>")


def _describe(item) -> str:
    if isinstance(item, Effect):
        return item.name
    if isinstance(item, Performed):
        return repr(item)
    effect, *args = item
    return describe.call(effect, tuple(args))


def _matches(item, call) -> bool:
    """Whether the expected ``item`` (Effect, tuple or Performed) matches a recorded call."""
    if isinstance(item, Effect):
        return call.effect is item
    if isinstance(item, Performed):
        return item == call
    effect, *args = item
    return call.effect is effect and describe.args_match(tuple(args), call.args)
