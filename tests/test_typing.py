"""The typed user programs of tests/typing run (``make typecheck`` type-checks
them with mypy --strict and pyright), and the package declares its types."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import kina_fx

TYPING = Path(__file__).parent / "typing"


def test_package_is_marked_typed():
    assert (Path(kina_fx.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("program", ["user_program.py", "effects_program.py"])
def test_typed_program_runs(program):
    result = subprocess.run([sys.executable, str(TYPING / program)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
