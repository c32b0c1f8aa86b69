"""quiet_host.c: what only a real C process shows (stderr must stay empty).

Floating-point conditions at the ABI give IEEE results and print nothing,
taped or not (docs/abi.md, "Floating-point conditions"); refused calls read
nothing (operands on a PROT_NONE page); a tape left recording on a fiber that
ended is stale and freeable; watch of a produced buffer and constant of a
watched one are refused (docs/autograd-abi.md).
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kina_fx.errors import Status
from test_c_host import HERE, kina_fx_config, run_clean

GCC = shutil.which("gcc")
pytestmark = [pytest.mark.integration, pytest.mark.skipif(GCC is None, reason="gcc is not installed")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    exe = tmp_path_factory.mktemp("quiet") / "quiet_host"
    subprocess.run([GCC, "-O1", "-Wall", "-Werror", str(HERE / "quiet_host.c"),
                    *kina_fx_config("--cflags", "--libs"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    result = run_clean([exe])
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def lines(run):
    return {name: rest.split() for name, _, rest in
            (line.partition(": ") for line in run.stdout.splitlines())}


def test_the_library_prints_nothing(run):
    assert run.stderr == ""


def _values(line):
    assert int(line[0]) == Status.SUCCESS, line
    return np.array([float(v) for v in line[1:]], np.float32)


def test_floating_point_conditions_are_ieee_results_and_print_nothing(lines):
    np.testing.assert_array_equal(_values(lines["log"]), np.float32([np.nan, -np.inf, np.log(2)]))
    np.testing.assert_array_equal(_values(lines["matmul"]), np.inf)
    np.testing.assert_allclose(_values(lines["taped log"]), [-np.inf, 0, np.log(4)], rtol=1e-6)
    np.testing.assert_allclose(_values(lines["taped grad"]), [np.inf, 1, 0.25], rtol=1e-6)


def test_refused_calls_read_nothing(lines):
    for name in ("copy huge mismatch", "copy small mismatch", "transpose mismatch"):
        assert lines[name] == [str(int(Status.VALIDATION)), "ValidationError:", "shape"], name


def test_a_tape_left_on_an_ended_fiber_is_stale_and_freeable(lines):
    assert lines["fiber"] == ["0", "3"]                       # KINA_FIBER_DONE
    assert lines["stale watch"][:2] == ["1", "ValidationError:"]
    assert lines["stale end"][:2] == ["1", "ValidationError:"]
    assert lines["stale free"] == ["0"]
    assert lines["stale free again"][:2] == ["1", "ValidationError:"]


def test_watch_of_a_produced_buffer_is_refused(lines):
    assert lines["produced"] == ["0"]
    assert lines["watch produced"][:2] == ["1", "ValidationError:"]
    assert lines["constant watched"][:2] == ["1", "ValidationError:"]
    assert lines["free"] == ["0"]
