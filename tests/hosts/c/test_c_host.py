"""C hosts of libkina_fx.so, built with gcc through ``kina-fx config`` and run with ``env -i``.

* host.c: every export, results and error paths, linked with
  ``$(kina-fx config --cflags --libs)`` (rpath included);
* dlopen_host.c: a host that opens the library with RTLD_LOCAL;
* a copy of the library where no kina_fx can be imported: every export must
  return 5 with a message, print nothing, and never 0.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from support.hosts import clean_env, kina_fx_config, run_clean

HERE = Path(__file__).parent
pytestmark = pytest.mark.integration

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed")


@needs_gcc
def test_c_host_via_kina_fx_config(tmp_path):
    exe = tmp_path / "host"
    cmd = [GCC, "-O2", "-Wall", "-Werror", str(HERE / "host.c"), *kina_fx_config("--cflags", "--libs"),
           "-lm", "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = run_clean([exe])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checks passed" in result.stdout
    assert result.stderr == ""


@needs_gcc
def test_threads_race_on_the_first_call(tmp_path):
    """Threads starting Python together, then calling with their own errors."""
    exe = tmp_path / "threads_host"
    subprocess.run([GCC, "-O2", "-Wall", "-Werror", str(HERE / "threads_host.c"),
                    *kina_fx_config("--cflags", "--libs"), "-lpthread", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    for _ in range(3):  # the start-up race differs run to run
        result = run_clean([exe])
        assert result.returncode == 0, result.stdout + result.stderr
        assert ", 0 failures" in result.stdout and result.stderr == ""


@needs_gcc
def test_config_paths_exist():
    (includedir,) = kina_fx_config("--includedir")
    (libdir,) = kina_fx_config("--libdir")
    assert (Path(includedir) / "kina_fx.h").is_file()
    assert (Path(libdir) / "libkina_fx.so").is_file()


@pytest.fixture(scope="module")
def dlopen_host(tmp_path_factory):
    if GCC is None:
        pytest.skip("gcc is not installed")
    exe = tmp_path_factory.mktemp("dlopen") / "dlopen_host"
    subprocess.run([GCC, "-O2", "-Wall", "-Werror", str(HERE / "dlopen_host.c"), "-ldl", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def test_dlopen_rtld_local(dlopen_host):
    (library,) = kina_fx_config("--library")
    result = run_clean([dlopen_host, library])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dlopen_host: ok" in result.stdout
    assert result.stderr == ""


def _fake_venv(root: Path) -> Path:
    """A venv layout without kina_fx: pyvenv.cfg, bin/python3 -> the base interpreter."""
    base = Path(sysconfig.get_config_var("BINDIR")) / f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert base.exists(), base
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python3").symlink_to(base)
    (root / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n")
    libdir = root / "lib" / "kina"
    libdir.mkdir(parents=True)
    (library,) = kina_fx_config("--library")
    shutil.copy(library, libdir / "libkina_fx.so")
    shutil.copy(Path(library).parent / "_libkina_fx_cpython.so", libdir)  # what the loader loads
    return libdir / "libkina_fx.so"


def test_failed_start_returns_internal_error_silently(dlopen_host, tmp_path):
    """The library finds the venv above it (pyvenv.cfg) and starts its interpreter;
    that venv has no kina_fx, so every call reports 5 with a message -- never
    cffi's silent 0 -- and nothing is printed."""
    lonely = _fake_venv(tmp_path / "venv")
    result = run_clean([dlopen_host, lonely, "5"])
    assert result.returncode == 0, result.stdout + result.stderr
    # Either cffi's own module or kina_fx is missing there; both are reported.
    assert "status 5: kina_fx: " in result.stdout
    assert "No module named" in result.stdout
    assert result.stderr == ""


def test_kina_fx_python_overrides_the_interpreter(dlopen_host, tmp_path):
    """KINA_FX_PYTHON wins over the venv found above the library."""
    lonely = _fake_venv(tmp_path / "venv")
    result = subprocess.run([*clean_env(), f"KINA_FX_PYTHON={sys.executable}", str(dlopen_host), str(lonely)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dlopen_host: ok" in result.stdout


# A regular (non-editable) install into fresh venvs, from the wheel and from
# the sdist: tests/package/test_dist.py.
