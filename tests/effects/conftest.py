"""Every test here runs on both implementations (the ``impl`` fixture, tests/conftest.py)."""
import os

import pytest


@pytest.fixture(autouse=True)
def _on_both_implementations(impl):
    return impl


def pytest_configure(config):
    if os.environ.get("KINA_FX_TAIL_CROSSCHECK") == "1":
        from support.tail_crosscheck import TailCrosscheck
        config.pluginmanager.register(TailCrosscheck(), "tail_crosscheck")
