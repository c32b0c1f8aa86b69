"""The kit's failures: raised so that the code under test cannot swallow them.

A failure of the kit (a scripted ``sequence`` that runs out, an answer that
cannot take the perform's arguments, an effect that escapes every handler...)
happens *inside* the code under test, at a perform.  It is raised as a
:class:`Failure`: pytest's ``Failed`` (what ``pytest.fail`` raises) when pytest
is installed, a ``BaseException`` in any case, so ``except Exception`` in the
code under test lets it through.  Code that catches even that does not hide
it: every failure is kept as *pending* until it is seen leaving the
``ScriptedHandler`` block (or ``run``) it was raised in; a block that ends
while one of its failures is pending raises it again there, and the pytest
plugin fails a test that ends with a failure still pending.
"""
from __future__ import annotations

import threading
from typing import NoReturn

try:
    import pytest
except ImportError:        # the kit works without pytest; its failures are then plain BaseExceptions
    pytest = None

# Kit frames are left out of pytest's tracebacks, as pytest-mock leaves out its own.
__tracebackhide__ = True

__all__ = ["Failure", "fail", "pending"]

_Base = pytest.fail.Exception if pytest is not None else BaseException


class Failure(_Base):  # type: ignore[misc,valid-type]
    """A failure of kina_fx.testing, raised at a perform in the code under test.

    A ``BaseException`` (pytest's ``Failed`` when pytest is installed), so that
    ``except Exception`` in the code under test does not catch it."""

    __module__ = "kina_fx.testing"       # where users import it from

    def __init__(self, message: str):
        if pytest is not None:
            super().__init__(message, pytrace=True)
        else:
            super().__init__(message)
        self.message = message

    def __str__(self):
        return self.message


class Pending:
    """The failures raised and not yet seen leaving the block they were raised in."""

    def __init__(self):
        self._lock = threading.Lock()
        self._failures: list[Failure] = []

    def add(self, failure: Failure) -> None:
        with self._lock:
            self._failures.append(failure)

    def settle(self, failures) -> None:
        """These failures were reported (seen propagating): no longer pending."""
        with self._lock:
            self._failures = [f for f in self._failures if not any(f is g for g in failures)]

    def take(self) -> list[Failure]:
        """Every pending failure (and forget them)."""
        with self._lock:
            failures, self._failures = self._failures, []
        return failures


#: Every failure the kit raised in this process that is still pending (the
#: pytest plugin takes them at the end of each test).
pending = Pending()


def fail(message: str, raised: "list | None" = None) -> NoReturn:
    """Raise a :class:`Failure`, pending until it is seen leaving its block;
    ``raised``, when given, is the raising handler's own list of them."""
    failure = Failure(message)
    pending.add(failure)
    if raised is not None:
        raised.append(failure)
    raise failure
