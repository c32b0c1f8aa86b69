"""Both implementations of the effects runtime in every test run (a pytest plugin).

kina_fx has two implementations of its effects runtime: the compiled one
(``kina_fx._speedups``) and the pure-Python reference (``KINA_FX_PURE_PYTHON=1``).
A process runs one of them, chosen once at import (``kina_fx.fibers.speedups``):
the classes' fields, the functions modules imported by name, the library's
embedded interpreter all follow that choice, so the two cannot be swapped
inside one process.

The ``impl`` fixture ("compiled" / "python") parametrizes every test of the
folders whose conftest asks for it (effects, abi, hosts/c, hosts/ocaml); a test (or a
parameter) marked ``only_impl("compiled")`` is about that implementation's own
machinery and exists there only (the other run deselects it).  The tests of
the implementation this process runs run here; those of the other one run
in one child pytest process, started as soon as collection ends and running
beside this one, whose reports are replayed here at the end: ``pytest``
alone shows both, test by test.

Environment:
    KINA_FX_TEST_IMPL=compiled|python  run only that implementation's tests,
        all in this process (no child); the child gets it, and so does CI's
        pass under KINA_FX_PURE_PYTHON=1.
    KINA_FX_PURE_PYTHON=1  this process runs the pure-Python reference (so
        the child runs the compiled one).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

IMPLS = ("compiled", "python")
ONLY = os.environ.get("KINA_FX_TEST_IMPL")          # run only this one, here
REPORT = os.environ.get("KINA_FX_TEST_REPORT")      # set in a child: where its reports go
SELECTED = os.environ.get("KINA_FX_TEST_SELECTED")  # set in a child: the node ids to run


def running() -> str:
    """The implementation this process runs."""
    from kina_fx import fibers
    return "python" if fibers.speedups is None else "compiled"


def impl_env(impl: str) -> dict:
    """The environment variables that select ``impl`` in a subprocess started
    with a clean environment (``env -i``); others inherit this process's."""
    return {"KINA_FX_PURE_PYTHON": "1"} if impl == "python" else {}


@pytest.fixture(params=IMPLS)
def impl(request):
    """The implementation this test runs on ("compiled" or "python")."""
    if request.param != running():
        # Only when kina_fx._speedups is missing: not a skip, which would let a
        # build that silently failed pass on the Python half alone.
        pytest.fail("kina_fx._speedups was not built (see the build_ext output of pip "
                    "install); KINA_FX_TEST_IMPL=python runs the pure-Python half alone")
    return request.param


def _impl_of(item):
    """The implementation ``item`` runs on; None for a test without ``impl``,
    "none" for one that does not exist on it (the only_impl mark)."""
    callspec = getattr(item, "callspec", None)
    impl = None if callspec is None else callspec.params.get("impl")
    only = item.get_closest_marker("only_impl")
    if impl is not None and only is not None and only.args[0] != impl:
        return "none"
    return impl


# ---- this process: which tests run here, which in the child ------------------------------

class _Child:
    """The pytest process that runs the other implementation's tests."""

    def __init__(self, config, impl, items):
        self.impl = impl
        self.nodeids = {item.nodeid for item in items}
        self.dir = Path(tempfile.mkdtemp(prefix="kina_fx_impl_"))
        self.report = self.dir / "reports.jsonl"
        self.log = self.dir / "output.txt"
        selected = self.dir / "selected.txt"
        selected.write_text("\n".join(sorted(self.nodeids)))
        env = dict(os.environ, KINA_FX_TEST_IMPL=impl, KINA_FX_TEST_REPORT=str(self.report),
                   KINA_FX_TEST_SELECTED=str(selected))
        env.pop("KINA_FX_PURE_PYTHON", None)
        env.update(impl_env(impl))
        files = sorted({nodeid.split("::")[0] for nodeid in self.nodeids})
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
        if config.option.maxfail:
            args.append(f"--maxfail={config.option.maxfail}")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=str(config.rootpath), env=env, stdout=log,
                                         stderr=subprocess.STDOUT)
        self.reports = None

    def results(self, config) -> dict:
        """{node id: [reports]} once the child has ended."""
        if self.reports is None:
            self.proc.wait()
            self.reports = {}
            if self.report.exists():
                for line in self.report.read_text().splitlines():
                    data = json.loads(line)
                    report = config.hook.pytest_report_from_serializable(config=config, data=data)
                    if isinstance(report.longrepr, list):    # a skip's (path, line, reason)
                        report.longrepr = tuple(report.longrepr)
                    self.reports.setdefault(report.nodeid, []).append(report)
        return self.reports

    def missing(self, item):
        """A failed report for a test the child did not run to its end."""
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return pytest.TestReport(
            item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed",
            f"the {self.impl} implementation's pytest process (exit status "
            f"{self.proc.returncode}) did not run this test to its end; the end of its "
            f"output:\n{tail}",
            "call", [])

    def stop(self):
        if self.proc.poll() is None:     # the session stopped early (-x, Ctrl-C)
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_config = []                         # this session's config (for the report hooks)


def pytest_configure(config):
    config._kina_fx_child = None
    _config[:] = [config]
    if REPORT:
        Path(REPORT).write_text("")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    here = running()
    mine, theirs, dropped = [], [], []
    for item in items:
        impl = _impl_of(item)
        if impl is None:
            mine.append(item)
        elif impl == "none":
            dropped.append(item)
        elif ONLY is not None:
            (mine if impl == ONLY else dropped).append(item)
        else:
            (mine if impl == here else theirs).append(item)
    if SELECTED:                     # a child: exactly what its parent handed it
        wanted = set(Path(SELECTED).read_text().splitlines())
        dropped += [item for item in mine if item.nodeid not in wanted]
        mine = [item for item in mine if item.nodeid in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = mine + theirs         # the child's reports are replayed last
    if theirs and not config.option.collectonly:
        other = "python" if here == "compiled" else "compiled"
        config._kina_fx_child = _Child(config, other, theirs)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    child = item.config._kina_fx_child
    if child is None or item.nodeid not in child.nodeids:
        return None
    reports = list(child.results(item.config).get(item.nodeid, ()))
    if not any(report.when == "teardown" for report in reports):
        reports.append(child.missing(item))      # it never ran, or its process died in it
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_sessionfinish(session):
    child = session.config._kina_fx_child
    if child is not None:
        child.stop()


# ---- a child: its reports, for the parent ---------------------------------------------------

def pytest_runtest_logreport(report):
    if REPORT:
        config = _config[0]
        data = config.hook.pytest_report_to_serializable(config=config, report=report)
        with open(REPORT, "a") as out:
            out.write(json.dumps(data) + "\n")
