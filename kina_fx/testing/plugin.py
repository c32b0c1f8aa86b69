"""The pytest plugin (registered through kina_fx's ``pytest11`` entry point,
which names :mod:`kina_fx.testing`; that package imports what is here).

* the ``no_unhandled_effects`` fixture, marker and ini option;
* a test in which the kit raised a failure that the code under test swallowed
  fails at tear-down;
* a kit failure's traceback goes from the test to the perform that failed,
  without kina_fx's own frames (the kit's, the handlers' and fibers').
"""
from __future__ import annotations

import os
from typing import Any

import pytest

from .escapes import escape_message, forbid_unhandled_effects
from .failures import Failure, pending

__all__ = ["pytest_configure", "pytest_addoption", "pytest_runtest_makereport",
           "no_unhandled_effects_fixture", "kina_fx_kit_checks"]

_KINA_FX = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "no_unhandled_effects: fail the test when an effect escapes every handler")


def pytest_addoption(parser):
    parser.addini("kina_fx_no_unhandled_effects", type="bool", default=False,
                  help="kina_fx: fail every test in which an effect escapes every handler")


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    excinfo = call.excinfo
    if excinfo is not None and isinstance(excinfo.value, Failure):
        _unlink_kina_fx_frames(excinfo.tb)
        excinfo.traceback = type(excinfo.traceback)(excinfo.tb)
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed


def _unlink_kina_fx_frames(tb):
    """Leave kina_fx's frames out of a traceback (the first entry, pytest's, stays).

    The traceback objects themselves are relinked: pytest cuts a traceback
    at the test function by rebuilding it from the raw chain, which would
    bring filtered entries back."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_KINA_FX):
            kept.append(tb)
        tb = tb.tb_next
    for entry, after in zip(kept, kept[1:] + [None]):
        entry.tb_next = after


def _raise(message):
    raise Failure(message)


@pytest.fixture(name="no_unhandled_effects")
def no_unhandled_effects_fixture(request) -> Any:
    """Fail the test, naming the effect and its arguments, when an effect
    escapes every handler (even if the code catches what is raised).
    Yields the list of escaped performs."""
    check = forbid_unhandled_effects(fail=_raise)
    check.check_on_exit = False           # reported below, as a tear-down failure
    with check as escaped:
        yield escaped
    if escaped and not request.node.stash.get(_CALL_FAILED, False):
        # The failure raised at the perform did not fail the test: the code
        # under test swallowed it (``except BaseException``).
        pytest.fail(escape_message(escaped), pytrace=False)


@pytest.fixture(name="_kina_fx_kit_checks", autouse=True)
def kina_fx_kit_checks(request):
    pending.take()                        # left by code outside any test
    if (request.node.get_closest_marker("no_unhandled_effects") is not None
            or request.config.getini("kina_fx_no_unhandled_effects")):
        request.getfixturevalue("no_unhandled_effects")
    yield
    swallowed = pending.take()
    if swallowed and not request.node.stash.get(_CALL_FAILED, False):
        pytest.fail(f"the code under test swallowed this failure of kina_fx.testing "
                    f"(raised at a perform, caught by an `except BaseException`):\n{swallowed[0]}",
                    pytrace=False)
