"""The old home of :mod:`kina_fx.demos.mlp`, kept so that ``python -m
kina_fx.demo_mlp`` and ``import kina_fx.demo_mlp`` keep working."""
import sys

from .demos import mlp as _mlp

if __name__ == "__main__":
    raise SystemExit(_mlp.main())
sys.modules[__name__] = _mlp
