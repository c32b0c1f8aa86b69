"""The sdist and the wheel, built by ``python -m build`` and installed as a user would.

One build makes both (the wheel from the sdist, in pip's isolated build
environment, whose path disappears afterwards).  The wheel goes into a fresh
venv and the sdist into another, each at a path with a space, neither with
the optional extras; on CPython 3.11 the wheel's venv is made with Debian's
/usr/bin/python3.11 where it exists -- another build of the same minor
version than the one that built the wheel.  Against each install: the C
hosts built through ``kina-fx config`` and through pkg-config, run with
``env -i``; Python checks (effects, the ABI from Python, the paths API);
``--version``; the one-line message of ``kina-fx demo`` without its extra.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import kina_fx

ROOT = Path(__file__).resolve().parents[2]
C_HOSTS = ROOT / "tests" / "hosts" / "c"
GCC = shutil.which("gcc")
BASH = shutil.which("bash")
MINOR = f"{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(GCC is None or BASH is None, reason="gcc and bash are needed")]

# The native build inputs an sdist must carry (and every other tracked file of
# kina_fx/ffi/c and kina_fx/_speedups_c, checked below): without them `pip install kina_fx-*.tar.gz` fails.
NATIVE_INPUTS = ("build.py", "kina_runtime.c", "kina_loader.c", "kina_fx.h",
                 "kina_exports.h", "exports.map")


def _run(cmd, timeout=900, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result


def _warnings(output: str) -> list[str]:
    # This machine's pip configuration names an index directory that may be
    # absent; pip says so on every call.  That is not kina_fx's build talking.
    return [line for line in output.splitlines()
            if re.search(r"warn|deprecat", line, re.I) and "is ignored: it is neither" not in line]


def _base_python() -> str:
    """The interpreter running the tests, outside any venv."""
    return str(Path(sys.base_prefix) / "bin" / f"python{MINOR}")


def _debian_python() -> str | None:
    """Debian's own CPython of this minor version, when it can make venvs."""
    path = f"/usr/bin/python{MINOR}"
    if not os.access(path, os.X_OK) or os.path.realpath(path) == os.path.realpath(_base_python()):
        return None
    ok = subprocess.run([path, "-c", "import ensurepip, venv"], capture_output=True)
    return path if ok.returncode == 0 else None


NATIVE_DIRS = ("kina_fx/ffi/c", "kina_fx/_speedups_c")


def _tracked_native_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", *NATIVE_DIRS], cwd=ROOT, capture_output=True,
                         text=True)
    if out.returncode != 0:  # not a git checkout (e.g. tests run from the sdist)
        return [str(p.relative_to(ROOT)) for d in NATIVE_DIRS for p in (ROOT / d).iterdir()
                if p.suffix in (".c", ".h", ".py", ".map")]
    return out.stdout.split()


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # Built from a copy of the tree, in-place build products included (the sdist
    # must leave them out): the sdist step writes kina_fx.egg-info beside
    # setup.py, and another test run may be building from the same tree.
    tree = tmp_path_factory.mktemp("tree") / "kina_fx"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache",
        ".pytest_cache", ".hypothesis"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    result = _run([sys.executable, "-m", "build", "--outdir", str(out), str(tree)], env=env)
    (sdist,) = out.glob("kina_fx-*.tar.gz")
    (wheel,) = out.glob("kina_fx-*.whl")
    return {"sdist": sdist, "wheel": wheel, "log": result.stdout + result.stderr}


def _make_venv(python: str, where: Path, dist: Path) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    _run([python, "-m", "venv", str(where)])
    result = _run([str(where / "bin" / "python"), "-m", "pip", "install", "-q", str(dist)])
    assert _warnings(result.stdout + result.stderr) == [], result.stdout + result.stderr
    return where


@pytest.fixture(scope="module")
def installs(dists, tmp_path_factory):
    root = tmp_path_factory.mktemp("installs")
    wheel_python = _debian_python() or _base_python()
    return {
        "wheel": _make_venv(wheel_python, root / "with space" / "wheel venv", dists["wheel"]),
        "sdist": _make_venv(_base_python(), root / "other place" / "sdist venv", dists["sdist"]),
    }


def test_build_prints_no_warnings(dists):
    assert _warnings(dists["log"]) == []


def test_sdist_has_every_native_input(dists):
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for name in NATIVE_INPUTS:
        assert f"kina_fx/ffi/c/{name}" in names
    missing = [f for f in _tracked_native_files() if f not in names]
    assert missing == []
    assert "LICENSE" in names and not any(n.endswith((".so", ".pyc")) for n in names)


def test_wheel_has_the_library_and_no_sources(dists):
    names = zipfile.ZipFile(dists["wheel"]).namelist()
    for name in ("kina_fx/libkina_fx.so", "kina_fx/_libkina_fx_cpython.so",
                 "kina_fx/include/kina_fx.h", "kina_fx/pkgconfig/kina_fx.pc", "kina_fx/py.typed"):
        assert name in names
    assert not any(n.endswith((".c", ".map")) or "/ffi/c/" in n or "/_speedups_c/" in n for n in names)
    assert any(n.endswith("dist-info/licenses/LICENSE") for n in names)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{tag}-{tag}-" in dists["wheel"].name  # tied to this CPython minor version


def test_wheel_names_no_build_path(dists):
    """Neither library holds a path of the build: not pip's build environment
    (gone once the build ends), not this machine's libpython directory."""
    with zipfile.ZipFile(dists["wheel"]) as whl:
        for name in ("kina_fx/libkina_fx.so", "kina_fx/_libkina_fx_cpython.so"):
            data = whl.read(name)
            assert b"build-env" not in data and b"/tmp/" not in data
            assert sys.base_prefix.encode() not in data and sys.prefix.encode() not in data


def _bash(script: str, **kw) -> subprocess.CompletedProcess:
    return _run([BASH, "-euo", "pipefail", "-c", script], timeout=300, **kw)


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_c_host_with_kina_fx_config(installs, kind, tmp_path):
    venv = installs[kind]
    exe = tmp_path / "host"
    # eval: the flags are shell-quoted and the path has spaces
    _bash(f'eval "gcc -O2 -Wall {C_HOSTS / "host.c"} $({shlex.quote(str(venv / "bin" / "kina-fx"))} '
          f'config --cflags --libs) -lm -o {exe}"')
    result = _run(["env", "-i", str(exe)])
    assert "checks passed" in result.stdout and result.stderr == ""


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_c_host_with_pkg_config(installs, kind, tmp_path):
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is not installed")
    venv = installs[kind]
    exe = tmp_path / "memref_types_host"
    kina = shlex.quote(str(venv / "bin" / "kina-fx"))
    _bash(f'export PKG_CONFIG_PATH="$({kina} config --pkgconfigdir)"; '
          f'test "$(pkg-config --modversion kina_fx)" = {kina_fx.__version__}; '
          f'eval "gcc -std=c11 -Wall {C_HOSTS / "memref_types_host.c"} $(pkg-config --cflags --libs kina_fx) -o {exe}"')
    result = _run(["env", "-i", str(exe)])
    assert "memref_types_host: 0 failures" in result.stdout


PYTHON_CHECKS = r"""
import os, sys
import numpy as np
import kina_fx
from kina_fx import Effect, Handler, perform, ffi

venv = sys.argv[1]
for path in (kina_fx.get_library(), kina_fx.get_include(), kina_fx.get_pkgconfig_dir()):
    assert path.startswith(venv) and os.path.exists(path), path
Ask = Effect("dist.ask")
assert Handler(on={Ask: lambda k: k.resume(41)}).run(lambda: perform(Ask) + 1) == 42
import kina_fx._speedups  # the compiled fast path was built and installed
c, lib = ffi.load_library()
assert lib.kina_abi_version() == 1000
from kina_fx import memref
a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((3, 2), np.float32)
out = np.zeros((2, 2), np.float32)
ptr = lambda m: c.cast("kina_unranked_memref_t *", m.address)
ms = [memref.from_numpy(x) for x in (out, a, b)]
assert lib._mlir_ciface_runtime_gpu_matmul_f32(*map(ptr, ms)) == 0
np.testing.assert_allclose(out, a @ b)
print("python checks ok")
"""


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_python_checks(installs, kind):
    venv = installs[kind]
    result = _run([str(venv / "bin" / "python"), "-c", PYTHON_CHECKS, str(venv)], cwd="/")
    assert "python checks ok" in result.stdout
    for cmd in ([str(venv / "bin" / "kina-fx"), "--version"],
                [str(venv / "bin" / "python"), "-m", "kina_fx", "--version"]):
        assert _run(cmd, cwd="/").stdout.strip() == f"kina_fx {kina_fx.__version__}"


def test_demo_without_its_extra_says_which_to_install(installs):
    venv = installs["wheel"]
    result = subprocess.run([str(venv / "bin" / "kina-fx"), "demo"], capture_output=True,
                            text=True, timeout=120, cwd="/")
    assert result.returncode == 1
    assert result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert "'demo' extra" in line and "pip install 'kina_fx[demo]'" in line
    quick = _run([str(venv / "bin" / "kina-fx"), "demo", "--quick"], cwd="/")
    assert "cooperative scheduler" in quick.stdout


def _other_minor_python() -> str:
    """A CPython of another minor version: pyenv's or PATH's, else a venv that says
    it is one (pyvenv.cfg is what the loader reads the version from)."""
    candidates = []
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for version in ("3.10", "3.11", "3.12", "3.13"):
        if version != MINOR:
            candidates += sorted(Path(pyenv_root, "versions").glob(f"{version}.*/bin/python{version}"))
            candidates += [Path(p) for p in [shutil.which(f"python{version}")] if p]
    for path in candidates:
        if os.access(path, os.X_OK):
            return str(path)
    return ""


def _wheel_library(installs) -> Path:
    return installs["wheel"] / "lib" / f"python{MINOR}" / "site-packages" / "kina_fx" / "libkina_fx.so"


@pytest.fixture(scope="module")
def dlopen_host(tmp_path_factory):
    host = tmp_path_factory.mktemp("dlopen") / "dlopen_host"
    _run([GCC, "-O2", str(C_HOSTS / "dlopen_host.c"), "-ldl", "-o", str(host)])
    return host


def test_wrong_interpreter_is_status_5_naming_both_libpythons(installs, dlopen_host, tmp_path):
    library, host = _wheel_library(installs), dlopen_host
    other = _other_minor_python()
    real_other = bool(other)
    if not other:  # a venv claiming a version 3.(minor+1)
        fake = tmp_path / "fake venv"
        (fake / "bin").mkdir(parents=True)
        (fake / "bin" / "python3").symlink_to(_base_python())
        (fake / "pyvenv.cfg").write_text(f"home = {Path(_base_python()).parent}\n"
                                         f"version = 3.{sys.version_info.minor + 1}.0\n")
        other = str(fake / "bin" / "python3")
    result = subprocess.run(["env", "-i", f"KINA_FX_PYTHON={other}", str(host), str(library), "5"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    message = result.stdout.splitlines()[0]
    assert message.startswith("status 5: kina_fx: libkina_fx.so was built for CPython " + MINOR)
    other_minor = re.search(r"is CPython (3\.\d+)", message).group(1)
    assert f"libpython{MINOR}" in message and f"libpython{other_minor}" in message
    assert other_minor != MINOR and result.stderr == ""

    if real_other:  # the same library opened inside a running Python of that version
        script = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
                  "lib.kina_last_error.restype = ctypes.c_char_p; "
                  "print(lib.runtime_gpu_free_all(), lib.kina_last_error().decode())")
        inside = _run([other, "-c", script, str(library)])
        assert inside.stdout.startswith(f"5 kina_fx: libkina_fx.so was built for CPython {MINOR}")
        assert f"this process already runs CPython {other_minor}" in inside.stdout


def test_a_library_outside_any_environment_says_what_to_set(installs, dlopen_host, tmp_path):
    """A wheel's library moved where no venv or site-packages surrounds it (and
    that, unlike an editable build, records no interpreter) asks for KINA_FX_PYTHON."""
    lonely = tmp_path / "no env"
    lonely.mkdir()
    for name in ("libkina_fx.so", "_libkina_fx_cpython.so"):
        shutil.copy(_wheel_library(installs).parent / name, lonely)
    result = subprocess.run(["env", "-i", str(dlopen_host), str(lonely / "libkina_fx.so"), "5"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "status 5: kina_fx: cannot find the Python interpreter" in result.stdout
    assert "set KINA_FX_PYTHON" in result.stdout
    ok = subprocess.run(["env", "-i", f"KINA_FX_PYTHON={installs['wheel'] / 'bin' / 'python'}",
                         str(dlopen_host), str(lonely / "libkina_fx.so")],
                        capture_output=True, text=True, timeout=120)
    assert "dlopen_host: ok" in ok.stdout, ok.stdout + ok.stderr
