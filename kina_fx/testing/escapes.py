"""Effects that escape every handler: a failure of the test, not an ``Unhandled`` to catch."""
from __future__ import annotations

from .. import fibers
from ..handlers import FORWARD, Handler
from .failures import Failure
from .scripted import Performed

__tracebackhide__ = True

__all__ = ["EscapedEffects", "forbid_unhandled_effects"]


class EscapedEffects(list):
    """The effects that escaped every handler during a test, as :class:`Performed`."""


class _Escapes:
    """The ``fun`` table of the outermost handler the check installs: every
    effect that reaches it escaped the code's handlers."""

    def __init__(self, escaped, fail):
        self.escaped = escaped
        self.fail = fail
        self.clauses = {}

    def get(self, effect, default=None):
        clause = self.clauses.get(effect)
        if clause is None:
            def clause(*args):
                if effect.default is not None:
                    return FORWARD         # its default answers it: not an escape
                self.escaped.append(Performed(effect, args))
                self.fail(escape_message([Performed(effect, args)]))
            self.clauses[effect] = clause
        return clause


class forbid_unhandled_effects:
    """Fail when an effect escapes every handler (a context manager; the
    ``no_unhandled_effects`` fixture is this, for a whole test).

    Inside, an effect that no handler handles (and that has no ``default``)
    raises :class:`~kina_fx.testing.Failure` at the perform (not
    ``Unhandled``: ``except Exception`` does not catch it), or calls
    ``fail(message)`` when given, and is recorded in ``escaped`` (what ``with``
    gives); leaving the block raises the failure again if the code swallowed
    it.  Only the entering thread is covered (each thread has its own handler
    stacks).
    """

    check_on_exit = True

    def __init__(self, fail=None):
        self.escaped = EscapedEffects()
        self._fail = fail or _raise_failure
        self._handler = Handler()
        self._handler.fun = _Escapes(self.escaped, self._fail)
        self._fiber = None

    def __enter__(self):
        # At the bottom of the running fiber's stack, under handlers already
        # installed there (a fixture's ``with handler: yield``): outermost.  No
        # clause is running at set-up or tear-down, so no search is in flight
        # whose position in this stack the insertion could shift.
        self._fiber = fibers.current()
        self._fiber.stack.insert(0, self._handler)
        return self.escaped

    def __exit__(self, exc_type, exc, tb):
        stack = self._fiber.stack
        if self._handler in stack:
            stack.remove(self._handler)
        if self.escaped and exc_type is None and self.check_on_exit:
            # The failure raised at the perform was swallowed by the code under test.
            raise Failure(escape_message(self.escaped))
        return False


def escape_message(escaped) -> str:
    first = escaped[0]
    more = (f" ({len(escaped)} escapes in all: {', '.join(map(repr, escaped))})"
            if len(escaped) > 1 else "")
    return (f"effect {first.effect.name} escaped unhandled: {first!r} was performed where "
            f"no handler handles it{more}")


def _raise_failure(message):
    raise Failure(message)
