"""What a pytest user sees when a test written with kina_fx.testing fails.

Each test writes a small user test module, runs it with pytest in a
subprocess (the kit loaded through kina_fx's pytest11 entry point, as in a
user's project) and asserts on the output: the message names the effect,
shows the first mismatch (and a diff for whole lists), and the traceback goes
from the test to the perform, without the kit's or kina_fx's own frames.
The implementation under test is the one this process runs
(KINA_FX_PURE_PYTHON is inherited).
"""
import os
import re

import pytest

pytest_plugins = ["pytester"]

HEADER = """
from kina_fx import Effect, Handler, perform
from kina_fx.testing import ScriptedHandler, raises, sequence

Ask = Effect("m.ask")
Put = Effect("m.put")
Log = Effect("m.log")


def service(questions):
    answers = []
    for q in questions:
        try:
            answers.append(perform(Ask, q))
        except Exception:                  # a broad except in the code under test
            answers.append("default")
    perform(Log, "done", len(answers))
    return answers
"""


def run(pytester, source, *args):
    pytester.makepyfile(test_user=HEADER + source)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    return result


def pattern(text):
    """An fnmatch pattern: ``*`` is the wildcard, ``[``, ``]`` and ``?`` are literal."""
    return re.sub(r"[\[\]?]", lambda m: f"[{m.group()}]", text)


def lines(result, patterns):
    result.stdout.fnmatch_lines([pattern(p) for p in patterns])


def no_line(result, text):
    result.stdout.no_fnmatch_line(pattern(text))


def no_kina_frames(result):
    """Neither the kit's frames nor kina_fx's handler frames are shown."""
    for fragment in ("kina_fx/testing/", "kina_fx/handlers.py", "kina_fx/fibers.py", "_speedups"):
        no_line(result, f"*{fragment}*")


def test_a_sequence_that_runs_out_fails_the_test_through_a_broad_except(pytester):
    result = run(pytester, """
def test_three_questions():
    mock = ScriptedHandler({Ask: sequence("y", "n"), Log: None})
    assert mock.run(service, ["a", "b", "c"]) == ["y", "n", "default"]
""")
    result.assert_outcomes(failed=1)
    lines(result, [
        ">*answers.append(perform(Ask, q))",
        "E*kina_fx.testing.Failure: m.ask was performed a 3rd time, but its script "
        "sequence('y', 'n') has 2 answers",
        "E*this perform: m.ask('c')",
        "E*performed before: m.ask('a'), m.ask('b')",
        "test_user.py:*: Failure",
    ])
    no_kina_frames(result)


def test_a_failure_swallowed_as_base_exception_is_reported_at_the_test(pytester):
    result = run(pytester, """
def swallow_all():
    try:
        return perform(Ask, "q")
    except BaseException:
        return "swallowed"

def test_with_block():
    with ScriptedHandler({Ask: sequence()}):
        swallow_all()

def test_pushed_by_hand():
    from kina_fx.handlers import push_handler, pop_handler
    mock = ScriptedHandler({Ask: sequence()})
    push_handler(mock)
    try:
        swallow_all()
    finally:
        pop_handler(mock)
""")
    result.assert_outcomes(failed=1, passed=1, errors=1)    # the tear-down check reports the second
    lines(result, [
        "*with ScriptedHandler({Ask: sequence()}):",
        "E*kina_fx.testing.Failure: m.ask was performed a 1st time, but its script sequence() has 0 answers",
    ])
    lines(result, [
        "*the code under test swallowed this failure of kina_fx.testing*",
        "m.ask was performed a 1st time, but its script sequence() has 0 answers",
    ])


def test_a_callable_answer_of_the_wrong_arity_names_the_effect(pytester):
    result = run(pytester, """
def test_arity():
    mock = ScriptedHandler({Ask: lambda: "yes", Log: None})
    mock.run(service, ["a"])
""")
    result.assert_outcomes(failed=1)
    lines(result, [
        "E*kina_fx.testing.Failure: the script's answer for m.ask, test_arity.<locals>.<lambda> "
        "(test_user.py:*), cannot take the perform's 1 argument m.ask('a'): too many positional arguments",
        "E*(to answer with the callable itself, script returns(test_arity.<locals>.<lambda>))",
    ])
    no_kina_frames(result)


def test_assert_calls_shows_the_first_mismatch_and_a_diff(pytester):
    result = run(pytester, """
def test_calls():
    mock = ScriptedHandler({Ask: "x", Log: None})
    mock.run(service, ["a", "b", "c"])
    mock.assert_calls((Ask, "a"), (Ask, "c"), (Log, "done", 2))
""")
    result.assert_outcomes(failed=1)
    lines(result, [
        ">*mock.assert_calls((Ask, \"a\"), (Ask, \"c\"), (Log, \"done\", 2))",
        "E*AssertionError: the performs differ from the expected ones (4 performed, 3 expected); "
        "first difference at #2: performed m.ask('b'), expected m.ask('c')",
        "E*diff (- expected, + performed):",
        "E*    m.ask('a')",
        "E*  + m.ask('b')",
        "E*    m.ask('c')",
        "E*  - m.log('done', 2)",
        "E*  + m.log('done', 3)",
    ])
    no_kina_frames(result)


def test_assert_performed_names_the_closest_perform_and_its_first_difference(pytester):
    result = run(pytester, """
def test_performed():
    mock = ScriptedHandler({Ask: "x", Log: None})
    mock.run(service, ["a"])
    mock.assert_performed(Log, "done", 2)
""")
    result.assert_outcomes(failed=1)
    lines(result, [
        "E*AssertionError: m.log('done', 2) was not performed; m.log was performed once: "
        "m.log('done', 1): argument 2 is 1, expected 2",
        "E*performed:",
        "E*#1 m.ask('a')",
        "E*#2 m.log('done', 1)",
    ])
    no_line(result, "*('done', 2,)*")
    no_kina_frames(result)


def test_counts_are_written_in_words(pytester):
    result = run(pytester, """
def test_times():
    mock = ScriptedHandler({Ask: "x", Log: None})
    mock.run(service, ["a", "b"])
    mock.assert_performed_times(Ask, 1)

def test_not_performed():
    mock = ScriptedHandler({Ask: "x", Log: None})
    mock.run(service, ["a"])
    mock.assert_not_performed(Log)

def test_not_in_script():
    mock = ScriptedHandler({Ask: "x", Log: None})
    mock.run(service, ["a"])
    mock.assert_performed(Put)
""")
    result.assert_outcomes(failed=3)
    lines(result, ["E*AssertionError: m.ask was performed twice, expected once"])
    lines(result, ["E*AssertionError: m.log was performed once"])
    lines(result, [
        "E*AssertionError: m.put (not in this ScriptedHandler's script, so never recorded; "
        "it answers m.ask, m.log) was not performed"])
    no_line(result, "*1 times*")
    no_kina_frames(result)


def test_reprs_are_readable(pytester):
    result = run(pytester, """
from kina_fx.testing import Performed, returns

def test_reprs():
    mock = ScriptedHandler({Ask: sequence("y", raises(KeyError), returns(str)), Log: None})
    mock.run(service, ["a"])
    print(mock.script[Ask], mock.calls, mock, sep="\\n")
    assert mock.calls == [Performed(Ask, ("b",))]
""")
    result.assert_outcomes(failed=1)
    lines(result, [
        "E*AssertionError: assert [m.ask('a'), m.log('done', 1)] == [m.ask('b')]",
        "E*At index 0 diff: m.ask('a') != m.ask('b')",
        "*Captured stdout call*",
        "sequence('y', raises(KeyError), returns(<class 'str'>))",
        "[m.ask('a'), m.log('done', 1)]",
        "<ScriptedHandler m.ask, m.log: 2 performs>"])
    no_line(result, "*object at 0x*")


@pytest.mark.parametrize("pure", ["", "1"], ids=["compiled", "pure-python"])
def test_perform_with_keyword_arguments_names_the_effect(pytester, monkeypatch, pure):
    if pure:
        monkeypatch.setenv("KINA_FX_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("KINA_FX_PURE_PYTHON", raising=False)
    result = run(pytester, """
def test_keywords():
    with ScriptedHandler({Ask: "x"}):
        perform(Ask, question="a")
""")
    result.assert_outcomes(failed=1)
    lines(result, [
        "E*TypeError: perform(Effect('m.ask'), ...) got keyword argument question: "
        "an effect's arguments are positional, as in perform(effect, *args)"])
    no_line(result, "E*_speedups*")


TYPED = """
Price: Effect[[str, int], float] = Effect("m.price")

def total(items):
    return sum(perform(Price, item, n) for item, n in items)
"""


def test_typed_effects_check_the_script(pytester):
    result = run(pytester, TYPED + """
def test_value_of_the_wrong_type():
    ScriptedHandler({Price: "cheap"})

def test_callable_of_the_wrong_arity():
    ScriptedHandler({Price: lambda item: 1.0})

def test_answer_of_the_wrong_type():
    mock = ScriptedHandler({Price: lambda item, n: str(n)})
    mock.run(total, [("pen", 2)])

def test_perform_of_the_wrong_arity():
    mock = ScriptedHandler({Price: 1.5})
    mock.run(perform, Price, "pen")
""")
    result.assert_outcomes(failed=4)
    lines(result, [
        "E*TypeError: the script answers m.price with 'cheap' (str), but m.price answers float "
        "(Price: Effect[[str, int], float] in test_user)"])
    lines(result, [
        "E*TypeError: the script's answer for m.price, test_callable_of_the_wrong_arity.<locals>.<lambda> "
        "(test_user.py:*), cannot take m.price's 2 parameters (Price: Effect[[str, int], float] in "
        "test_user): too many positional arguments"])
    lines(result, [
        ">*return sum(perform(Price, item, n) for item, n in items)",
        "E*kina_fx.testing.Failure: the script's answer for m.price, *<lambda> (test_user.py:*), "
        "returned '2' (str), but m.price answers float (Price: Effect[[str, int], float] in test_user)"])
    lines(result, [
        "E*kina_fx.testing.Failure: m.price('pen'): m.price takes 2 arguments "
        "(Price: Effect[[str, int], float] in test_user), it was performed with 1"])
    no_kina_frames(result)


def test_an_async_answer_outside_aio_run_says_how_to_run_it(pytester):
    result = run(pytester, """
async def fetch(question):
    return "answer"

def test_async_answer_in_sync_code():
    mock = ScriptedHandler({Ask: fetch, Log: None})
    mock.run(service, ["a"])
""")
    result.assert_outcomes(failed=1)
    lines(result, [
        "E*kina_fx.testing.Failure: the script's answer for m.ask, fetch (test_user.py:*), is async: it is "
        "awaited on the running event loop, so the code that performs it must run under "
        "kina_fx.aio.run(): `await aio.run(fn, *args, handlers=[mock])` or "
        "`await mock.run_async(fn, *args)`"])
    no_line(result, "*never awaited*")


def test_async_answers_pass_under_aio_run(pytester):
    result = run(pytester, """
import asyncio

async def fetch(question):
    await asyncio.sleep(0)
    return question.upper()

def test_async_answer():
    mock = ScriptedHandler({Ask: fetch, Log: None})
    assert asyncio.run(mock.run_async(service, ["a", "b"])) == ["A", "B"]
    mock.assert_calls((Ask, "a"), (Ask, "b"), (Log, "done", 2))
""")
    result.assert_outcomes(passed=1)
    no_line(result, "*never awaited*")


def test_the_old_context_manager_name_warns(pytester):
    result = run(pytester, """
import kina_fx.testing

def test_old_name():
    with kina_fx.testing.no_unhandled_effects() as escaped:
        pass
    assert escaped == []
""", "-W", "always::DeprecationWarning")
    result.assert_outcomes(passed=1)
    lines(result, [
        "*DeprecationWarning: kina_fx.testing.no_unhandled_effects, the context manager, is now "
        "forbid_unhandled_effects (the pytest fixture keeps the name no_unhandled_effects)"])


def test_escaped_effects_name_the_effect_and_its_arguments(pytester):
    result = run(pytester, """
def test_escapes(no_unhandled_effects):
    service(["where?"])
""")
    result.assert_outcomes(failed=1)
    lines(result, [
        "E*kina_fx.testing.Failure: effect m.ask escaped unhandled: m.ask('where?') was performed "
        "where no handler handles it"])
    no_kina_frames(result)


@pytest.mark.skipif(os.environ.get("KINA_FX_PURE_PYTHON") == "1", reason="once is enough")
def test_the_same_tests_pass_once_the_code_is_right(pytester):
    """The passing side of the tests above: the same kit, code that is right."""
    result = run(pytester, TYPED + """
from kina_fx.testing import ANY

def test_all_right():
    mock = ScriptedHandler({Ask: sequence("y", "n"), Log: None, Price: lambda item, n: 1.5 * n})
    with mock:
        assert service(["a", "b"]) == ["y", "n"]
        assert total([("pen", 2)]) == 3.0
    mock.assert_calls((Ask, "a"), (Ask, "b"), (Log, "done", 2), (Price, "pen", ANY))
    mock.assert_performed_times(Ask, 2)
    mock.assert_not_performed(Put)

def test_handled(no_unhandled_effects):
    with ScriptedHandler({Ask: "x", Log: None}):
        service(["q"])
""")
    result.assert_outcomes(passed=2)
