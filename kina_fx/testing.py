"""Testing code that uses effects: scripted handlers, assertions, and a pytest plugin.

Registered with pytest through the ``pytest11`` entry point of kina_fx (see
pyproject.toml), so that installing kina_fx makes the fixtures available;
everything here can also be imported and used without pytest's plugin system.

* :class:`ScriptedHandler` answers effects from a table (values, callables,
  :func:`sequence`, :func:`raises`, :data:`OUTER`) and records every perform
  with its arguments; its ``assert_*`` methods check what was performed.
* The ``no_unhandled_effects`` fixture (or the ``no_unhandled_effects`` marker,
  or ``kina_fx_no_unhandled_effects = true`` in the pytest ini file) fails a
  test, with the effect's name and payload, as soon as an effect escapes every
  handler, even if the code under test catches the ``Unhandled``.

docs/testing.md has worked examples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import fibers
from .handlers import FORWARD, Effect, Handler, perform

__all__ = ["ScriptedHandler", "Performed", "sequence", "raises", "OUTER",
           "EscapedEffects", "no_unhandled_effects"]


@dataclass(frozen=True)
class Performed:
    """One recorded perform: the effect and the tuple of its arguments."""

    effect: Effect
    args: tuple

    def __repr__(self):
        return f"{self.effect.name}{self.args!r}"


class _Sequence:
    def __init__(self, answers):
        self.answers = list(answers)
        self.given = 0

    def __call__(self, effect, args):
        if self.given >= len(self.answers):
            raise AssertionError(
                f"{effect.name} performed {self.given + 1} times, but its script has "
                f"{len(self.answers)} answers (last arguments {args!r})")
        answer = self.answers[self.given]
        self.given += 1
        return _give(answer, effect, args)


class _Raises:
    def __init__(self, exc):
        self.exc = exc

    def __call__(self, effect, args):
        exc = self.exc
        raise exc() if isinstance(exc, type) else exc


def sequence(*answers):
    """Script answers given in turn, one per perform (each may itself be a
    value, a callable or :func:`raises`); one perform too many fails the test."""
    return _Sequence(answers)


def raises(exc):
    """Script an exception (instance or class) raised at the perform."""
    if not (isinstance(exc, BaseException) or (isinstance(exc, type) and issubclass(exc, BaseException))):
        raise TypeError(f"raises() needs an exception, not {exc!r}")
    return _Raises(exc)


class _Outer:
    def __repr__(self):
        return "OUTER"


#: Script answer: record the perform, then let the handlers outside answer it.
OUTER = _Outer()


def _give(answer, effect, args):
    if isinstance(answer, (_Sequence, _Raises)):
        return answer(effect, args)
    if answer is OUTER:
        return perform(effect, *args)      # a fun clause runs outside its handler
    if callable(answer) and not isinstance(answer, Effect):
        return answer(*args)
    return answer


def _describe(item):
    if isinstance(item, Effect):
        return item.name
    effect, *args = item
    return f"{effect.name}{tuple(args)!r}"


def _matches(call, item):
    if isinstance(item, Effect):
        return call.effect is item
    effect, *args = item
    return call.effect is effect and call.args == tuple(args)


class ScriptedHandler(Handler):
    """A handler that answers effects from a script and records every perform.

    ``ScriptedHandler({Get: 5, Fetch: lambda url: "<page>", Ask: sequence("y", "n"),
    Boom: raises(KeyError), Log: OUTER})``: a plain value answers as itself, a
    callable (other than an Effect) is called with the perform's arguments and
    its result answers (to answer with a function, script ``lambda *a: fn``), :func:`sequence` answers
    in turn, :func:`raises` raises at the perform, :data:`OUTER` passes the
    perform on to the handlers outside.  Every answer is given in place (a
    ``fun`` clause), so the handler can be installed with ``with`` as well as
    used with ``run(fn, *args)``.  Effects not in the script are not handled
    (and not recorded).
    """

    __slots__ = ("script", "calls")

    def __init__(self, script):
        script = dict(script)
        for effect in script:
            if not isinstance(effect, Effect):
                raise TypeError(f"script keys must be Effect instances, not {effect!r}")
        self.script = script
        self.calls: list[Performed] = []
        super().__init__(fun={effect: self._clause(effect, answer) for effect, answer in script.items()})

    def _clause(self, effect, answer):
        calls = self.calls

        def clause(*args):
            calls.append(Performed(effect, args))
            return _give(answer, effect, args)
        clause.__name__ = clause.__qualname__ = f"scripted_{effect.name}"
        return clause

    # --- assertions ------------------------------------------------------------

    def performed(self, effect: Effect) -> list[tuple]:
        """The argument tuples of every perform of ``effect``, in order."""
        return [c.args for c in self.calls if c.effect is effect]

    def count(self, effect: Effect, *args) -> int:
        """How many times ``effect`` was performed (with exactly ``args``, if given)."""
        return sum(1 for c in self.calls if c.effect is effect and (not args or c.args == args))

    def assert_performed(self, effect: Effect, *args) -> None:
        """``effect`` was performed at least once (with exactly ``args``, if given)."""
        if not self.count(effect, *args):
            what = _describe((effect, *args)) if args else effect.name
            raise AssertionError(f"{what} was not performed; performed: {self._log()}")

    def assert_not_performed(self, effect: Effect, *args) -> None:
        """``effect`` was never performed (with exactly ``args``, if given)."""
        n = self.count(effect, *args)
        if n:
            what = _describe((effect, *args)) if args else effect.name
            raise AssertionError(f"{what} was performed {n} times; performed: {self._log()}")

    def assert_performed_times(self, effect: Effect, times: int, *args) -> None:
        """``effect`` was performed exactly ``times`` times (with ``args``, if given)."""
        n = self.count(effect, *args)
        if n != times:
            what = _describe((effect, *args)) if args else effect.name
            raise AssertionError(f"{what} was performed {n} times, expected {times}; "
                                 f"performed: {self._log()}")

    def assert_order(self, *expected) -> None:
        """These performs happened in this order (others may come in between).

        Each item is an ``Effect`` (any arguments) or a tuple ``(effect, *args)``.
        """
        position = 0
        previous = None
        for item in expected:
            while position < len(self.calls) and not _matches(self.calls[position], item):
                position += 1
            if position == len(self.calls):
                where = f" after {_describe(previous)}" if previous is not None else ""
                raise AssertionError(f"no {_describe(item)}{where} (expected in order: "
                                     f"{', '.join(map(_describe, expected))}); performed: {self._log()}")
            position += 1
            previous = item

    def assert_calls(self, *expected) -> None:
        """The performs were exactly these, in this order (items as for assert_order)."""
        if len(expected) != len(self.calls) or not all(map(_matches, self.calls, expected)):
            raise AssertionError(f"performed {self._log()}, expected "
                                 f"[{', '.join(_describe(e) for e in expected)}]")

    def reset(self) -> None:
        """Forget the recorded performs (the script's sequences go on where they were)."""
        self.calls.clear()

    def _log(self):
        return "[" + ", ".join(map(repr, self.calls)) + "]" if self.calls else "nothing"

    def __repr__(self):
        return f"<ScriptedHandler {', '.join(e.name for e in self.script)}: {len(self.calls)} performs>"


# --- escaping effects -----------------------------------------------------------

class EscapedEffects(list):
    """The effects that escaped every handler during a test, as :class:`Performed`."""


class _Escapes:
    """The ``fun`` table of the outermost handler the fixture installs: every
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
                self.fail(f"effect {effect.name!r} escaped unhandled with payload {args!r}")
            self.clauses[effect] = clause
        return clause


class no_unhandled_effects:
    """Install the escape check on this thread's root fiber (a context manager).

    Inside, an effect that no handler handles (and that has no ``default``)
    calls ``fail(message)`` at the perform site (by default: raise
    AssertionError; the pytest fixture passes ``pytest.fail``, which ``except
    Exception`` does not catch) and is recorded in ``escaped``; leaving the
    block raises AssertionError if the code swallowed that failure.  Only the
    entering thread is covered (each thread has its own handler stacks).
    """

    check_on_exit = True

    def __init__(self, fail=None):
        self.escaped = EscapedEffects()
        self._fail = fail or _assertion_failure
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
            raise AssertionError(_escape_message(self.escaped))
        return False


def _escape_message(escaped):
    first = escaped[0]
    more = f" ({len(escaped)} escapes in all: {list(escaped)})" if len(escaped) > 1 else ""
    return f"effect {first.effect.name!r} escaped unhandled with payload {first.args!r}{more}"


def _assertion_failure(message):
    raise AssertionError(message)


# --- the pytest plugin ---------------------------------------------------------

try:
    import pytest
except ImportError:        # used without pytest: no plugin, the rest still works
    pytest = None

if pytest is not None:
    def pytest_configure(config):
        config.addinivalue_line(
            "markers", "no_unhandled_effects: fail the test when an effect escapes every handler")

    def pytest_addoption(parser):
        parser.addini("kina_fx_no_unhandled_effects", type="bool", default=False,
                      help="kina_fx: fail every test in which an effect escapes every handler")

    _CALL_FAILED = pytest.StashKey[bool]()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when == "call":
            item.stash[_CALL_FAILED] = report.failed

    @pytest.fixture(name="no_unhandled_effects")
    def _no_unhandled_effects_fixture(request) -> Any:
        """Fail the test, naming the effect and its payload, when an effect
        escapes every handler (even if the code catches the ``Unhandled``).
        Yields the list of escaped performs."""
        check = no_unhandled_effects(fail=pytest.fail)
        check.check_on_exit = False           # reported below, as a tear-down failure
        with check as escaped:
            yield escaped
        if escaped and not request.node.stash.get(_CALL_FAILED, False):
            # The failure raised at the perform did not fail the test: the code
            # under test swallowed it (``except BaseException``).
            pytest.fail(_escape_message(escaped), pytrace=False)

    @pytest.fixture(autouse=True)
    def _kina_fx_strict_effects(request):
        if (request.node.get_closest_marker("no_unhandled_effects") is not None
                or request.config.getini("kina_fx_no_unhandled_effects")):
            request.getfixturevalue("no_unhandled_effects")
        yield
