"""kina_fx.testing.ScriptedHandler used directly: answers, recording, assertions,
matchers, checked scripts, async answers, multi-shot replay, kit failures.

The messages as a pytest user sees them are checked in test_kit_messages.py
(real pytest runs); here the behaviour, in combination with the other handler
kinds (one-shot ``on`` handlers, fibers, MultiHandler, aio), on whichever
implementation runs (KINA_FX_PURE_PYTHON=1 or the compiled one).
"""
import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kina_fx import Effect, Handler, Stepper, Unhandled, aio, fiber, perform
from kina_fx.multishot import MultiHandler, under_multihandler
from kina_fx.testing import (ANY, OUTER, Failure, Performed, ScriptedHandler, raises, returns,
                             sequence)

Get = Effect("test.kit.get")
Put = Effect("test.kit.put")
Ask = Effect("test.kit.ask")
Log = Effect("test.kit.log")
Choose = Effect("test.kit.choose")

# Typed effects: the kit finds these declarations (module-level annotations).
Price: Effect[[str, int], float] = Effect("test.kit.price")
Name: Effect[[], str] = Effect("test.kit.name")
Anything: Effect[..., int] = Effect("test.kit.anything")


def increment():
    perform(Put, perform(Get) + 1)
    perform(Log, "incremented")
    return perform(Get)


def test_answers_values_callables_sequences_and_records_every_perform():
    mock = ScriptedHandler({Get: sequence(1, 2), Put: lambda v: None, Log: None})
    with mock:
        assert increment() == 2
    assert mock.calls == [Performed(Get, ()), Performed(Put, (2,)), Performed(Log, ("incremented",)),
                          Performed(Get, ())]
    mock.assert_performed(Put, 2)
    mock.assert_performed(Log)
    mock.assert_performed_times(Get, 2)
    mock.assert_not_performed(Put, 3)
    mock.assert_order(Get, (Put, 2), Get)
    mock.assert_calls(Get, (Put, 2), Log, Get)
    assert mock.performed(Put) == [(2,)] and mock.count(Get) == 2
    mock.reset()
    assert mock.calls == [] and mock.count(Get) == 0


def test_returns_answers_a_callable_as_it_is_where_a_plain_callable_is_called():
    mock = ScriptedHandler({Get: str, Ask: returns(str), Log: returns(None)})
    with mock:
        assert perform(Get) == ""               # str() called
        assert perform(Ask) is str              # str itself
        assert perform(Log) is None
    assert repr(returns(str)) == "returns(<class 'str'>)"


def test_raises_and_outer():
    mock = ScriptedHandler({Ask: sequence("y", raises(KeyError("no more"))), Get: raises(ValueError),
                            Log: OUTER})
    with mock:
        assert perform(Ask) == "y"
        with pytest.raises(KeyError):
            perform(Ask)
        with pytest.raises(ValueError):
            perform(Get)
        with pytest.raises(Unhandled):     # OUTER: recorded, then nothing outside answers
            perform(Log, "x")
    outer_log = []
    with Handler(fun={Log: outer_log.append}):
        with mock:
            perform(Log, "to the outer handler")
    assert outer_log == ["to the outer handler"]
    assert mock.count(Log) == 2


def test_matchers_in_expected_arguments():
    mock = ScriptedHandler({Put: None, Log: None})
    with mock:
        perform(Put, 0.1 + 0.2)
        perform(Log, "at", 12.5, {"user": 7})
    mock.assert_performed(Put, pytest.approx(0.3))
    mock.assert_performed(Log, "at", ANY, ANY)
    mock.assert_calls((Put, pytest.approx(0.3)), (Log, ANY, 12.5, {"user": 7}))
    assert mock.count(Put, 0.3) == 0                       # exact comparison without approx
    assert Performed(Put, (ANY,)) == mock.calls[0] == Performed(Put, (pytest.approx(0.3),))
    with pytest.raises(AssertionError):
        mock.assert_performed(Log, "at", ANY)              # one argument short


def test_arrays_compare_by_shape_and_elements():
    np = pytest.importorskip("numpy")
    mock = ScriptedHandler({Put: None})
    with mock:
        perform(Put, np.arange(3))
    mock.assert_performed(Put, np.arange(3))
    mock.assert_not_performed(Put, np.arange(4))
    mock.assert_not_performed(Put, np.arange(3).reshape(3, 1))
    with pytest.raises(AssertionError):
        mock.assert_calls((Put, np.zeros(3)))


def test_under_a_control_handler_in_fibers_and_through_forwarding():
    mock = ScriptedHandler({Get: 10, Log: None})
    inner = Handler(on={Put: lambda k, v: k.resume(perform(Log, "put", v))})

    def body():
        perform(Put, 1)
        return perform(Get) + 1
    assert mock.run(lambda: inner.run(body)) == 11
    mock.assert_calls((Log, "put", 1), Get)


def test_inside_a_stepper_that_catches_every_effect():
    """The kit's own recording never reaches a Stepper's catch-all handler."""
    mock = ScriptedHandler({Get: sequence(1, 2), Log: None})

    def body():
        with mock:
            perform(Log, "before")
            x = perform(Ask)                     # not scripted: suspends the Stepper
            return x + perform(Get) + perform(Get)
    stepper = Stepper(body)
    assert stepper.step() == Stepper.SUSPENDED and stepper.effect is Ask
    assert stepper.step(10) == Stepper.DONE and stepper.result == 13
    mock.assert_calls((Log, "before"), Get, Get)


def test_in_a_shallow_fiber():
    mock = ScriptedHandler({Get: 5})
    shallow = Handler(on={Ask: lambda k, v: ("asked", v)}, ret=lambda v: ("done", v))
    k = fiber(lambda first: perform(Ask, perform(Get) + first))
    with mock:
        assert k.resume_with(1, shallow) == ("asked", 6)
    mock.assert_calls(Get)


def test_under_multihandler_says_whether_code_may_be_replayed():
    seen = []

    def body():
        seen.append(under_multihandler())
        perform(Choose, [1, 2])
        seen.append(under_multihandler())
        return 0
    assert not under_multihandler()
    amb.run(body)
    assert seen == [True, True, True, True]
    assert Handler(on={Ask: lambda k: k.resume(under_multihandler())}).run(lambda: perform(Ask)) is False


# --- kit failures: raised so that the code under test cannot swallow them --------

def swallowing(fn):
    def run(*args):
        try:
            return fn(*args)
        except Exception:
            return "swallowed"
    return run


def test_a_sequence_that_runs_out_is_a_failure_that_except_exception_lets_through():
    mock = ScriptedHandler({Ask: sequence("y", "n")})
    with pytest.raises(Failure, match=r"test.kit.ask was performed a 3rd time, but its script "
                                      r"sequence\('y', 'n'\) has 2 answers"):
        with mock:
            assert perform(Ask, 1) == "y" and perform(Ask, 2) == "n"
            swallowing(perform)(Ask, 3)
    assert isinstance(Failure("x"), BaseException) and not isinstance(Failure("x"), Exception)


def test_a_failure_swallowed_even_as_base_exception_is_raised_when_the_block_ends():
    def sloppy():
        try:
            perform(Ask)
        except BaseException:
            return "swallowed"
    mock = ScriptedHandler({Ask: sequence()})
    with pytest.raises(Failure, match="performed a 1st time"):
        with mock:
            assert sloppy() == "swallowed"
    with pytest.raises(Failure, match="performed a 2nd time"):
        mock.run(sloppy)
    # and when the code goes on to raise something else, the failure wins
    mock = ScriptedHandler({Ask: sequence()})

    def raises_after():
        sloppy()
        raise ValueError("later")
    with pytest.raises(Failure) as info:
        mock.run(raises_after)
    assert isinstance(info.value.__context__, ValueError)


def test_a_callable_that_cannot_take_the_arguments_is_a_failure_naming_the_effect():
    mock = ScriptedHandler({Ask: lambda question: "yes"})
    with pytest.raises(Failure, match=r"the script's answer for test.kit.ask, .*<lambda> \(test_scripted_handler"
                                      r".py:\d+\), cannot take the perform's 2 arguments "
                                      r"test.kit.ask\('a', 1\): too many positional arguments"):
        mock.run(swallowing(perform), Ask, "a", 1)
    # an error inside the callable is the callable's, raised as it is
    mock = ScriptedHandler({Ask: lambda question: question.missing})
    with pytest.raises(AttributeError):
        mock.run(perform, Ask, "a")


# --- checked scripts (autospec for typed effects) ---------------------------------

def test_script_values_are_checked_against_a_typed_effects_answer():
    with pytest.raises(TypeError, match=r"the script answers test.kit.price with 'cheap' \(str\), but "
                                        r"test.kit.price answers float \(Price: Effect\[\[str, int\], float\] "
                                        r"in test_scripted_handler\)"):
        ScriptedHandler({Price: "cheap"})
    with pytest.raises(TypeError, match="answers test.kit.name with 3"):
        ScriptedHandler({Name: sequence("a", 3)})
    with pytest.raises(TypeError, match="answers test.kit.anything with 'x'"):
        ScriptedHandler({Anything: returns("x")})
    # what conforms: int for float, the declared class, raises/OUTER
    ScriptedHandler({Price: 3, Name: sequence("a", raises(KeyError), OUTER), Anything: 1})


def test_script_callables_are_checked_against_a_typed_effects_parameters():
    with pytest.raises(TypeError, match=r"the script's answer for test.kit.price, .*<lambda> .*cannot take "
                                        r"test.kit.price's 2 parameters .*: too many positional arguments"):
        ScriptedHandler({Price: lambda item: 1.0})
    with pytest.raises(TypeError, match="cannot take test.kit.name's 0 parameters"):
        ScriptedHandler({Name: sequence("a", lambda x: "b")})
    ScriptedHandler({Price: lambda item, n: 1.0, Anything: lambda *a: 1, Name: lambda: "n"})


def test_performs_and_answers_are_checked_at_the_perform():
    mock = ScriptedHandler({Price: lambda item, n: "free", Name: "n", Anything: lambda *a: len(a)})
    with pytest.raises(Failure, match=r"test.kit.price\('pen'\): test.kit.price takes 2 arguments .*"
                                      r"it was performed with 1"):
        mock.run(swallowing(perform), Price, "pen")
    with pytest.raises(Failure, match=r"the script's answer for test.kit.price, .*returned 'free' \(str\), "
                                      r"but test.kit.price answers float"):
        mock.run(swallowing(perform), Price, "pen", 2)
    assert mock.run(perform, Anything, 1, 2, 3) == 3       # Effect[..., int]: any arguments


Factory: Effect[[], type] = Effect("test.kit.factory")


def test_a_callable_answer_for_an_effect_that_answers_callables_hints_at_returns():
    mock = ScriptedHandler({Factory: dict})           # dict() is called: {} is not a type
    with pytest.raises(Failure, match=r"returned \{\} \(dict\), but test.kit.factory answers type .*\n"
                                      r"  \(to answer with the callable itself, script returns\(dict\)\)"):
        mock.run(perform, Factory)
    assert ScriptedHandler({Factory: returns(dict)}).run(perform, Factory) is dict


def test_an_effects_default_gives_its_arity():
    Defaulted = Effect("test.kit.defaulted")
    Defaulted.default = lambda a, b: a + b
    try:
        with pytest.raises(TypeError, match="cannot take test.kit.defaulted's 2 parameters"):
            ScriptedHandler({Defaulted: lambda a: a})
        mock = ScriptedHandler({Defaulted: 5})
        with pytest.raises(Failure, match="takes 2 arguments"):
            mock.run(perform, Defaulted, 1)
    finally:
        Defaulted.default = None


# --- async answers ------------------------------------------------------------------

Fetch = Effect("test.kit.fetch")


def crawl(urls):
    return [perform(Fetch, u) for u in urls]


def test_async_answers_are_awaited_on_the_running_loop_and_recorded():
    order = []

    async def fetch(url):
        order.append(("start", url))
        await asyncio.sleep(0)
        order.append(("end", url))
        return f"<{url}>"

    async def other_task():
        order.append(("other", None))

    async def main():
        mock = ScriptedHandler({Fetch: fetch, Log: None})
        task = asyncio.ensure_future(other_task())
        pages = await mock.run_async(crawl, ["a", "b"])
        await task
        return mock, pages
    mock, pages = asyncio.run(main())
    assert pages == ["<a>", "<b>"]
    assert ("other", None) in order and order.index(("other", None)) < order.index(("end", "a"))
    mock.assert_calls((Fetch, "a"), (Fetch, "b"))


def test_async_mock_sequences_and_coroutine_functions_under_aio_run():
    from unittest.mock import AsyncMock

    fetch = AsyncMock(return_value="<page>")

    async def slow(url):
        await asyncio.sleep(0)
        return "slow " + url

    async def async_body():
        return [perform(Fetch, "x"), perform(Fetch, "y"), perform(Fetch, "z")]

    mock = ScriptedHandler({Fetch: sequence(fetch, slow, "plain")})
    assert asyncio.run(aio.run(async_body, handlers=[mock])) == ["<page>", "slow y", "plain"]
    fetch.assert_awaited_once_with("x")
    assert mock.performed(Fetch) == [("x",), ("y",), ("z",)]


def test_an_async_answer_raising_raises_at_the_perform():
    async def failing(url):
        await asyncio.sleep(0)
        raise ConnectionError(url)

    def body():
        try:
            return perform(Fetch, "u")
        except ConnectionError as exc:
            return f"retry {exc}"
    mock = ScriptedHandler({Fetch: failing})
    assert asyncio.run(mock.run_async(body)) == "retry u"


def test_an_async_answer_outside_aio_run_is_a_failure_that_says_what_to_do():
    async def fetch(url):
        return url
    mock = ScriptedHandler({Fetch: fetch})
    with _no_warnings():
        with pytest.raises(Failure, match=r"is async: .* must run under kina_fx.aio.run\(\)"):
            mock.run(swallowing(crawl), ["a"])


class _no_warnings:
    """No 'coroutine was never awaited' warning comes out of the block."""

    def __enter__(self):
        import warnings
        self._catch = warnings.catch_warnings(record=True)
        self._seen = self._catch.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc):
        import gc
        gc.collect()
        self._catch.__exit__(*exc)
        assert [str(w.message) for w in self._seen if "never awaited" in str(w.message)] == []


# --- multi-shot replay ------------------------------------------------------------

def all_results(k, options):
    return [r for o in options for r in k.resume(o)]


amb = MultiHandler(on={Choose: all_results}, ret=lambda v: [v])


def test_inside_multishot_code_each_perform_is_recorded_once_per_shot():
    mock = ScriptedHandler({Log: None, Get: sequence(10, 20, 30)})

    def body():
        with mock:
            perform(Log, "start")
            base = perform(Get)                          # before the choice: once
            x = perform(Choose, [1, 2, 3])
            perform(Log, "chose", x)                     # after: once per shot
            return base + x
    assert amb.run(body) == [11, 12, 13]
    mock.assert_calls((Log, "start"), Get, (Log, "chose", 1), (Log, "chose", 2), (Log, "chose", 3))
    assert mock.count(Get) == 1                           # the sequence moved on once


def test_around_multishot_code_each_perform_is_recorded_once_per_shot():
    mock = ScriptedHandler({Log: None, Get: sequence(10, 20, 30, 40)})

    def body():
        base = perform(Get)
        x = perform(Choose, [1, 2])
        return base + x + perform(Get)
    assert mock.run(amb.run, body) == [10 + 1 + 20, 10 + 2 + 30]
    assert mock.count(Get) == 3


def test_multishot_nested_choices_and_sequences_inside():
    mock = ScriptedHandler({Ask: sequence(*range(100)), Log: OUTER})
    outer_log = []

    def body():
        with mock:
            a = perform(Choose, [0, 1])
            n = perform(Ask, a)
            b = perform(Choose, [0, 1])
            perform(Log, (a, b, n))
            return (a, b, n)
    with Handler(fun={Log: outer_log.append}):
        results = amb.run(body)
    # Ask is performed once per shot of the first choice, Log once per leaf
    assert results == [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    assert mock.performed(Ask) == [(0,), (1,)]
    assert outer_log == [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1)] and mock.count(Log) == 4


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_multishot_recording_matches_a_reference_enumeration(widths):
    """Generated search trees: the record lists the performs in the order of a
    depth-first enumeration in which each perform happens once per shot."""
    mock = ScriptedHandler({Log: None, Get: sequence(*range(1000))})

    def body():
        with mock:
            path = []
            for depth, width in enumerate(widths):
                perform(Log, "at", tuple(path))
                path.append(perform(Choose, list(range(width))) + perform(Get) * 0)
            return tuple(path)
    results = amb.run(body)

    # the reference: Log at the root, then per choice a Get and the subtree
    expected = []

    def walk(path):
        expected.append(Performed(Log, ("at", tuple(path))))
        for choice in range(widths[len(path)]):
            expected.append(Performed(Get, ()))
            if len(path) + 1 < len(widths):
                walk(path + [choice])
    walk([])
    assert len(results) == math.prod(widths)
    assert mock.calls == expected
