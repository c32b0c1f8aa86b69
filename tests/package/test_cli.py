"""The conventions of the kina-fx command and the package (no compiler needed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kina_fx
from kina_fx import cli


def test_version_three_ways(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"kina_fx {kina_fx.__version__}\n"
    for cmd in ([sys.executable, "-m", "kina_fx", "--version"],
                [str(Path(sys.executable).parent / "kina-fx"), "-V"]):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        assert out == f"kina_fx {kina_fx.__version__}\n"


def test_paths_api_and_config_agree(capsys):
    for option, path in (("--includedir", kina_fx.get_include()),
                         ("--library", kina_fx.get_library()),
                         ("--pkgconfigdir", kina_fx.get_pkgconfig_dir())):
        assert cli.main(["config", option]) == 0
        assert capsys.readouterr().out == path + "\n"  # as is, not quoted
        assert Path(path).exists()
    assert (Path(kina_fx.get_include()) / "kina_fx.h").is_file()


def test_a_path_option_is_printed_alone(capsys):
    assert cli.main(["config", "--libdir", "--cflags"]) == 2
    assert "printed alone" in capsys.readouterr().err


def test_pkg_config_file_is_relocatable_and_versioned():
    text = (Path(kina_fx.get_pkgconfig_dir()) / "kina_fx.pc").read_text()
    assert "prefix=${pcfiledir}/.." in text
    assert f"Version: {kina_fx.__version__}" in text
    assert "/" + "tmp" not in text and str(Path.home()) not in text


def test_unknown_command_and_usage(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0 and "usage: kina-fx" in capsys.readouterr().out
