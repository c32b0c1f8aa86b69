"""Testing code that uses effects: scripted handlers, assertions, and a pytest plugin.

Code that performs its effects is tested by putting a handler around it:
nothing to patch, one ordered record across every dependency.

* :class:`ScriptedHandler` answers effects from a script (values, callables,
  ``async def`` callables awaited on the running loop, :func:`sequence`,
  :func:`raises`, :func:`returns`, :data:`OUTER`), checks the script against
  typed effects' signatures, and records every perform; its ``assert_*``
  methods check what was performed (arguments compared with ``==``, so
  :data:`ANY` and ``pytest.approx`` match).
* Failures of the kit at a perform (a sequence that runs out...) are
  :class:`Failure`, a ``BaseException`` the code under test cannot swallow.
* :class:`forbid_unhandled_effects` (a context manager), and in pytest the
  ``no_unhandled_effects`` fixture (or marker, or
  ``kina_fx_no_unhandled_effects = true`` in the ini file), fail a test as
  soon as an effect escapes every handler.

Registered with pytest through the ``pytest11`` entry point of kina_fx (see
pyproject.toml); everything here works without pytest too.  docs/testing.md
has the guide, a worked example and a comparison with ``unittest.mock``.
"""
from __future__ import annotations

import warnings

from .answers import ANY, OUTER, raises, returns, sequence
from .escapes import EscapedEffects, forbid_unhandled_effects
from .failures import Failure
from .scripted import Performed, ScriptedHandler

__all__ = ["ScriptedHandler", "Performed", "sequence", "raises", "returns", "OUTER", "ANY",
           "Failure", "EscapedEffects", "forbid_unhandled_effects"]

try:
    import pytest as _pytest
except ImportError:        # used without pytest: no plugin, the rest still works
    _pytest = None

if _pytest is not None:
    # What pytest finds in the module its entry point names.
    from .plugin import (kina_fx_kit_checks, no_unhandled_effects_fixture,  # noqa: F401
                         pytest_addoption, pytest_configure, pytest_runtest_makereport)


def __getattr__(name):
    if name == "no_unhandled_effects":
        warnings.warn("kina_fx.testing.no_unhandled_effects, the context manager, is now "
                      "forbid_unhandled_effects (the pytest fixture keeps the name "
                      "no_unhandled_effects)", DeprecationWarning, stacklevel=2)
        return forbid_unhandled_effects
    raise AttributeError(f"module 'kina_fx.testing' has no attribute {name!r}")
