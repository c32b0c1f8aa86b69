"""Typed effects and the typed user programs.

* The typed user programs of tests/typing run (``make typecheck`` type-checks
  them with mypy --strict and pyright), and the package declares its types.
* The generic Effect and Continuation work at run time on every supported
  Python.
* mypy and pyright accept tests/typing/typed_example.py and report exactly the
  errors planted in tests/typing_errors/planted_errors.py (skipped where the
  checkers are not installed; ``make typecheck`` runs them with
  KINA_FX_TYPECHECK=1, where a missing checker fails).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.abi import load_module

import kina_fx
from kina_fx import Continuation, Effect, Handler, perform
from kina_fx.handlers import FORWARD

TYPING = Path(__file__).parents[1] / "typing"


def test_package_is_marked_typed():
    assert (Path(kina_fx.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("program", ["user_program.py", "effects_program.py"])
def test_typed_program_runs(program):
    result = subprocess.run([sys.executable, str(TYPING / program)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(TESTS, "typing")
ERRORS = os.path.join(TESTS, "typing_errors")
ROOT = os.path.dirname(TESTS)
EXAMPLE = os.path.join(HERE, "typed_example.py")
PLANTED = os.path.join(ERRORS, "planted_errors.py")


def test_generic_effect_works_at_run_time_and_stays_interned():
    alias = Effect[[int, str], bool]
    eff = alias("typing.runtime")
    assert eff is Effect("typing.runtime") and type(eff) is Effect
    assert Continuation[int, str] is not None
    assert eff.on(print) == (eff, print) and eff.fun(len) == (eff, len)
    h = Handler(on=[eff.on(lambda k, n, s: k.resume(len(s) == n))])
    assert h.run(lambda: perform(eff, 2, "ab")) is True
    with Handler(fun=[eff.fun(lambda n, s: FORWARD), Effect("typing.other").fun(lambda: 1)]):
        with Handler(fun=[eff.fun(lambda n, s: n > 0)]):
            assert eff(1, "x") is True


def test_typed_example_runs():
    typed_example = load_module(EXAMPLE, "typed_example")
    assert typed_example.main() == {"result": (42, 42), "log": ["value 42"]}


def planted_lines():
    with open(PLANTED) as f:
        return {n for n, line in enumerate(f, 1) if "# planted:" in line}


def _tool(*names):
    """The first of these executables next to this Python or on PATH.  Missing:
    a skip, or a failure under KINA_FX_TYPECHECK=1 (``make typecheck``, whose
    venv has the checkers, runs these tests with it)."""
    for name in names:
        exe = os.path.join(os.path.dirname(sys.executable), name)
        if os.path.exists(exe) or shutil.which(name):
            return exe if os.path.exists(exe) else shutil.which(name)
    message = f"{' or '.join(names)} not installed (pip install -e '.[typing]')"
    if os.environ.get("KINA_FX_TYPECHECK") == "1":
        pytest.fail(message)
    pytest.skip(message)


def _error_lines(output, path, pattern):
    name = re.escape(os.path.basename(path))
    return {int(m.group(1)) for m in re.finditer(name + pattern, output)}


def test_mypy_accepts_the_example_and_reports_every_planted_error(tmp_path):
    _tool("mypy")
    proc = subprocess.run(
        # --explicit-package-bases: the files' package is found from the working
        # directory, not by walking up the tree for __init__.py files (a stray
        # one in a parent directory would break the walk).
        [sys.executable, "-m", "mypy", "--explicit-package-bases", "--follow-imports=silent",
         "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}",
         EXAMPLE, PLANTED],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert _error_lines(out, EXAMPLE, r":(\d+): error") == set(), out
    assert _error_lines(out, PLANTED, r":(\d+): error") == planted_lines(), out


def test_pyright_accepts_the_example_and_reports_every_planted_error():
    pyright = _tool("pyright", "basedpyright")
    out = ""
    # The example under tests/typing's strict configuration, the planted errors
    # under tests/typing_errors' standard one.
    for project, path, expected in ((HERE, EXAMPLE, set()), (ERRORS, PLANTED, planted_lines())):
        proc = subprocess.run([pyright, "--pythonpath", sys.executable, "--project", project, path],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert "could not be resolved" not in out, out
        assert _error_lines(out, path, r":(\d+):\d+ - error") == expected, out
