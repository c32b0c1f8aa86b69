"""libkina_fx.so loaded into a running Python starts without cffi's start-up spin lock.

Before Python 3.12 cffi's embedded start-up (``_cffi_carefully_make_gil``) uses
``PyCapsule_Type.tp_version_tag`` as a process-wide spin lock; any attribute
lookup on a capsule sets that tag, and the library's first export call then
spun forever (``import torch`` was enough).  The library's start-up guard now
sets up its embedded module itself when an interpreter is running
(docs/abi.md, "How the library finds its Python").

Each check runs ``tests/abi/inprocess_start_check.py`` in a fresh process (the
library starts once per process) with a timeout, so a hang fails the test.
The suite runs it with this interpreter; ``KINA_FX_TEST_PYTHONS`` (paths of
other interpreters with kina_fx installed, separated by ``os.pathsep``) adds
those, as in ``docs/abi.md``'s recipe for checking every supported Python.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("inprocess_start_check.py")
TIMEOUT_S = 180


def run_check(python: str, mode: str, threads: int = 1) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([python, str(SCRIPT), mode, str(threads)], capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{python} {mode}: the first export call did not return within {TIMEOUT_S} s "
                    "(cffi's start-up spin lock?)")


def has_module(python: str, name: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def interpreters() -> list[str]:
    extra = [p for p in os.environ.get("KINA_FX_TEST_PYTHONS", "").split(os.pathsep) if p]
    return [sys.executable, *extra]


@pytest.mark.parametrize("python", interpreters())
@pytest.mark.parametrize("mode, threads", [("plain", 1), ("capsule", 1), ("capsule", 4), ("torch", 1)])
def test_first_call_in_a_running_python(python, mode, threads):
    if mode == "torch" and not has_module(python, "torch"):
        pytest.skip(f"torch is not installed for {python} (the capsule lookup covers the cause)")
    result = run_check(python, mode, threads)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "start-check ok" in result.stdout
    assert result.stderr == ""
