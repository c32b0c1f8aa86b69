"""Suite-wide rules.

Under ``CI=true`` a skipped integration test is a failure: CI must prove the C,
MLIR and OCaml hosts, not silently skip them when a tool is missing.

The ``impl`` fixture runs a test on both implementations of the effects
runtime (tests/support/implementations.py); the folders whose conftest asks
for it run every test of theirs that way.
"""
import os

import pytest

pytest_plugins = ["support.implementations"]

_skipped_integration = []


def pytest_runtest_logreport(report):
    # (an expected failure, xfail, is reported as skipped too: it ran)
    if report.skipped and "integration" in report.keywords and not hasattr(report, "wasxfail"):
        _skipped_integration.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and _skipped_integration:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes") and _skipped_integration:
        terminalreporter.write_line(
            "CI=true and integration tests were skipped (this run FAILS):", red=True)
        for nodeid in _skipped_integration:
            terminalreporter.write_line("  " + nodeid, red=True)


@pytest.fixture(scope="session")
def kina():
    """``(ffi, lib)`` of the built libkina_fx.so, loaded in this process."""
    from kina_fx import ffi as kffi
    return kffi.load_library()


@pytest.fixture(scope="session")
def contract_lib(kina, tmp_path_factory):
    """tests/hosts/c/contract_lib.c built against the library and loaded (see contract_helpers.py)."""
    import shutil
    from pathlib import Path

    from support.abi import build_fixture_library
    from support.contract import CONTRACT_CDEF

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    ffi, _ = kina
    out = build_fixture_library(Path(__file__).parent / "hosts" / "c" / "contract_lib.c",
                                tmp_path_factory.mktemp("contract") / "libcontract.so", gcc)
    ffi.cdef(CONTRACT_CDEF)
    return ffi.dlopen(str(out))


@pytest.fixture
def fiber_calls(kina, contract_lib):
    """kina_fiber_* calls with out-parameters made for the caller (contract_helpers.Fibers)."""
    from support.contract import Fibers
    return Fibers(kina, contract_lib)
