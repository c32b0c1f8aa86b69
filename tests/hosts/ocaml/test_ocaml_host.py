"""An OCaml program (Debian's ocaml-nox, hand-written C stubs) driving the effects C ABI."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support.hosts import kina_fx_config, run_clean

HERE = Path(__file__).parent

pytestmark = pytest.mark.integration
OCAMLFIND = shutil.which("ocamlfind")
OCAMLOPT = shutil.which("ocamlopt")


@pytest.mark.skipif(OCAMLFIND is None or OCAMLOPT is None,
                    reason="OCaml (ocaml-nox, ocaml-findlib) is not installed")
def test_ocaml_host_generator_state_and_c_handler(tmp_path):
    for name in ("host.ml", "kina_stubs.c"):
        shutil.copy(HERE / name, tmp_path / name)
    (includedir,) = kina_fx_config("--includedir")
    libs = " ".join(kina_fx_config("--libs"))
    build = subprocess.run(
        [OCAMLFIND, "ocamlopt", "host.ml", "kina_stubs.c", "-ccopt", f"-I{includedir} -Wall",
         "-cclib", libs, "-o", "host"], cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    result = run_clean([tmp_path / "host"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "generator: 0 1 2 3 4 5" in result.stdout
    assert "state: final 1325" in result.stdout
    assert "checks passed" in result.stdout and "FAIL" not in result.stdout
    assert result.stderr == ""
