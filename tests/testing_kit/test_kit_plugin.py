"""kina_fx.testing's pytest plugin and the escape check: the ``no_unhandled_effects``
fixture, marker and ini option through real pytest runs (the plugin loaded from
kina_fx's pytest11 entry point, as a user's pytest loads it), and the
``forbid_unhandled_effects`` context manager directly."""
import importlib.metadata
import warnings

import pytest

import kina_fx.testing
from kina_fx import Effect, perform
from kina_fx.testing import Failure, Performed, ScriptedHandler, forbid_unhandled_effects

pytest_plugins = ["pytester"]

Ask = Effect("test.kit.plugin.ask")


def test_plugin_is_registered_through_the_pytest11_entry_point():
    points = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "kina_fx"]
    assert [e.value for e in points] == ["kina_fx.testing"]


def test_forbid_unhandled_effects_catches_even_swallowed_escapes():
    def sloppy():
        try:
            perform(Ask, "question", 42)
        except BaseException:
            return "swallowed"
    with pytest.raises(Failure, match=r"effect test.kit.plugin.ask escaped unhandled: "
                                      r"test.kit.plugin.ask\('question', 42\) was performed"):
        with forbid_unhandled_effects() as escaped:
            try:
                assert sloppy() == "swallowed"
            finally:
                assert escaped == [Performed(Ask, ("question", 42))]
    # handled effects and effects with a default pass untouched
    with_default = Effect("test.kit.plugin.with_default")
    with_default.default = lambda: "default"
    try:
        with forbid_unhandled_effects() as escaped:
            assert ScriptedHandler({Ask: 1}).run(lambda: perform(Ask)) == 1
            assert perform(with_default) == "default"
        assert escaped == []
    finally:
        with_default.default = None


def test_an_escape_is_a_failure_that_except_exception_lets_through():
    def broad():
        try:
            perform(Ask)
        except Exception:
            return "swallowed"
    with pytest.raises(Failure):
        with forbid_unhandled_effects():
            broad()


def test_the_old_name_of_the_context_manager_still_works_with_a_warning():
    with pytest.warns(DeprecationWarning, match="is now forbid_unhandled_effects"):
        old = kina_fx.testing.no_unhandled_effects
    assert old is forbid_unhandled_effects
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "no_unhandled_effects" not in kina_fx.testing.__all__
        from kina_fx.testing import forbid_unhandled_effects as new  # noqa: F401


# --- the plugin in real pytest runs ---------------------------------------------

TEST_HEADER = """
from kina_fx import Effect, Handler, perform
Ask = Effect("plugin.ask")
"""


def test_fixture_fails_the_test_with_the_effect_and_its_arguments(pytester):
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
    result.stdout.fnmatch_lines(["*effect plugin.ask escaped unhandled: plugin.ask('where', 7) was performed*"])


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
    result.stdout.fnmatch_lines(["*effect plugin.ask escaped unhandled: plugin.ask('x') was performed*"])


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
    result.stdout.fnmatch_lines(["*plugin.ask('m') was performed where no handler handles it*"])
    pytester.makeini("[pytest]\nkina_fx_no_unhandled_effects = true\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)


def test_a_kit_failure_caught_by_the_test_itself_still_fails_it(pytester):
    """A kit failure is a failure of the test, wherever it is caught; the
    ScriptedHandler block it left has reported it already."""
    pytester.makepyfile(TEST_HEADER + """
import pytest
from kina_fx.testing import Failure, ScriptedHandler, sequence

def test_caught_outside_the_block():
    with pytest.raises(Failure):
        with ScriptedHandler({Ask: sequence()}):
            perform(Ask)

def test_caught_inside_the_block():
    with ScriptedHandler({Ask: sequence()}):
        with pytest.raises(Failure):
            perform(Ask)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED *test_caught_inside_the_block*"])


def test_the_kit_works_without_pytest():
    """Without pytest the kit's failures are plain BaseExceptions, and the
    context manager still reports an escape the code swallowed."""
    import subprocess
    import sys
    code = """
import sys
sys.modules["pytest"] = None                 # import pytest now fails
from kina_fx import Effect, perform
from kina_fx.testing import Failure, ScriptedHandler, forbid_unhandled_effects, sequence
assert Failure.__mro__[1] is BaseException, Failure.__mro__
Ask = Effect("nopytest.ask")
mock = ScriptedHandler({Ask: sequence("y")})
try:
    with mock:
        perform(Ask)
        try:
            perform(Ask)
        except Exception:
            pass
except Failure as failure:
    print("raised:", failure)
try:
    with forbid_unhandled_effects():
        try:
            perform(Ask)
        except BaseException:
            pass
except Failure as failure:
    print("escaped:", failure)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "raised: nopytest.ask was performed a 2nd time, but its script sequence('y') has 1 answer",
        "  this perform: nopytest.ask()",
        "  performed before: nopytest.ask()",
        "escaped: effect nopytest.ask escaped unhandled: nopytest.ask() was performed where no "
        "handler handles it",
    ]
