"""kina_fx.testing: the scripted handler and its assertions directly, and the
pytest plugin through pytester (real pytest runs in subprocesses, the plugin
loaded from kina_fx's pytest11 entry point as a user's pytest loads it)."""
import importlib.metadata

import pytest

from kina_fx import Effect, Handler, Unhandled, perform
from kina_fx.testing import OUTER, Performed, ScriptedHandler, no_unhandled_effects, raises, sequence

pytest_plugins = ["pytester"]

Get = Effect("test.kit.get")
Put = Effect("test.kit.put")
Ask = Effect("test.kit.ask")
Log = Effect("test.kit.log")


def increment():
    perform(Put, perform(Get) + 1)
    perform(Log, "incremented")
    return perform(Get)


def test_scripted_handler_answers_from_values_callables_sequences_and_records():
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


def test_assertions_fail_with_what_was_performed():
    mock = ScriptedHandler({Get: 1, Put: None, Log: None})
    mock.run(increment)
    with pytest.raises(AssertionError, match=r"test.kit.put\(5,\) was not performed; performed: \[test.kit.get\(\)"):
        mock.assert_performed(Put, 5)
    with pytest.raises(AssertionError, match="performed 2 times, expected 1"):
        mock.assert_performed_times(Get, 1)
    with pytest.raises(AssertionError, match="no test.kit.put after test.kit.log"):
        mock.assert_order(Log, Put, Get)  # Put comes before Log only
    with pytest.raises(AssertionError, match="was performed 1 times"):
        mock.assert_not_performed(Log)
    with pytest.raises(AssertionError, match="expected"):
        mock.assert_calls(Get, Put)


def test_sequence_exhausted_and_raises_and_outer():
    mock = ScriptedHandler({Ask: sequence("y", raises(KeyError("no more"))), Get: raises(ValueError),
                            Log: OUTER})
    with mock:
        assert perform(Ask) == "y"
        with pytest.raises(KeyError):
            perform(Ask)
        with pytest.raises(AssertionError, match="performed 3 times, but its script has 2 answers"):
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


def test_mocked_handler_under_a_control_handler_and_in_fibers():
    mock = ScriptedHandler({Get: 10})
    inner = Handler(on={Put: lambda k, v: k.resume(None)})
    assert mock.run(lambda: inner.run(lambda: perform(Get) + 1)) == 11
    mock.assert_performed_times(Get, 1)


def test_no_unhandled_effects_context_manager_catches_even_swallowed_escapes():
    def sloppy():
        try:
            perform(Ask, "question", 42)
        except Exception:
            return "swallowed"
    with pytest.raises(AssertionError, match=r"'test.kit.ask' escaped unhandled with payload \('question', 42\)"):
        with no_unhandled_effects() as escaped:
            try:
                sloppy()
            finally:
                assert escaped == [Performed(Ask, ("question", 42))]
    # handled effects and effects with a default pass untouched
    with_default = Effect("test.kit.with_default")
    with_default.default = lambda: "default"
    try:
        with no_unhandled_effects() as escaped:
            assert ScriptedHandler({Ask: 1}).run(lambda: perform(Ask)) == 1
            assert perform(with_default) == "default"
        assert escaped == []
    finally:
        with_default.default = None


def test_plugin_is_registered_through_the_pytest11_entry_point():
    points = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "kina_fx"]
    assert [e.value for e in points] == ["kina_fx.testing"]


# --- the plugin in real pytest runs ---------------------------------------------

TEST_HEADER = """
from kina_fx import Effect, Handler, perform
Ask = Effect("plugin.ask")
"""


def test_fixture_fails_the_test_with_effect_name_and_payload(pytester):
    pytester.makepyfile(TEST_HEADER + """
def test_escapes(no_unhandled_effects):
    try:
        perform(Ask, "where", 7)
    except Exception:
        pass

def test_handled(no_unhandled_effects):
    assert Handler(fun={Ask: lambda *a: len(a)}).run(lambda: perform(Ask, 1, 2)) == 2
    assert no_unhandled_effects == []
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*effect 'plugin.ask' escaped unhandled with payload ('where', 7)*"])


def test_fixture_catches_an_escape_swallowed_as_base_exception(pytester):
    pytester.makepyfile(TEST_HEADER + """
def test_swallows_everything(no_unhandled_effects):
    try:
        perform(Ask, "x")
    except BaseException:
        pass
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)     # the tear-down check reports it
    result.stdout.fnmatch_lines(["*effect 'plugin.ask' escaped unhandled with payload ('x',)*"])


def test_marker_and_ini_switch_the_check_on(pytester):
    pytester.makepyfile(TEST_HEADER + """
import pytest

@pytest.mark.no_unhandled_effects
def test_marked():
    perform(Ask, "m")

def test_unmarked():
    try:
        perform(Ask, "u")
    except Exception as e:
        assert type(e).__name__ == "Unhandled"
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*'plugin.ask' escaped unhandled with payload ('m',)*"])
    pytester.makeini("[pytest]\nkina_fx_no_unhandled_effects = true\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)


def test_scripted_handler_in_a_user_test_suite(pytester):
    pytester.makepyfile(TEST_HEADER + """
from kina_fx.testing import ScriptedHandler

def greet():
    return "hello " + perform(Ask, "name?")

def test_greet():
    mock = ScriptedHandler({Ask: "ada"})
    assert mock.run(greet) == "hello ada"
    mock.assert_performed(Ask, "name?")

def test_greet_wrong_question():
    mock = ScriptedHandler({Ask: "ada"})
    mock.run(greet)
    mock.assert_performed(Ask, "age?")
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*plugin.ask('age[?]',) was not performed; performed: [[]plugin.ask('name[?]',)[]]*"])


def test_the_examples_in_docs_testing_md_pass(pytester):
    import os
    import re
    doc = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "testing.md")
    with open(doc) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 3
    pytester.makepyfile(**{f"test_doc_{i}": block for i, block in enumerate(blocks)})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
