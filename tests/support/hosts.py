"""Building and running C hosts of libkina_fx.so (tests/hosts/*)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .implementations import impl_env, running


def kina_fx_config(*flags: str) -> list[str]:
    """Flags from the installed ``kina-fx config`` console script."""
    script = Path(sys.executable).parent / "kina-fx"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kina_fx.cli"]
    out = subprocess.run(cmd + ["config", *flags], check=True, capture_output=True, text=True).stdout
    return out.split()


def clean_env() -> list[str]:
    """``env -i`` and the one variable that keeps this process's implementation
    of the effects runtime (KINA_FX_PURE_PYTHON) in the host's embedded Python."""
    return ["env", "-i", *(f"{name}={value}" for name, value in impl_env(running()).items())]


def run_clean(argv, **kw):
    """Run with an empty environment (env -i): no PATH, PYTHONPATH or LD_LIBRARY_PATH."""
    return subprocess.run([*clean_env(), *map(str, argv)], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 120), **kw)
