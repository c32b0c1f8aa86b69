"""Every test here runs on both implementations (the ``impl`` fixture, tests/conftest.py)."""
import pytest


@pytest.fixture(autouse=True)
def _on_both_implementations(impl):
    return impl
