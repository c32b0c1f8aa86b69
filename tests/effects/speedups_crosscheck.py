"""pytest plugin (``-p speedups_crosscheck``, with tests/ on sys.path): every
tail-resume check the session makes is answered by both the compiled and the
Python ``_returns_straight_to_driver``; any difference fails the session.
tests/effects/test_speedups.py runs the effects suites under it."""
from kina_fx import handlers

_seen = {"checks": 0, "mismatches": []}


def pytest_configure(config):
    compiled = handlers._returns_straight_to_driver
    reference = handlers._returns_straight_to_driver_py
    if compiled is reference:
        return

    def both(frame):
        got = compiled(frame)
        want = reference(frame)
        _seen["checks"] += 1
        if got != want:
            _seen["mismatches"].append((frame.f_code.co_filename, frame.f_lineno, got, want))
        return want

    handlers._returns_straight_to_driver = both
    # The compiled Continuation.resume makes its tail check in C; the Python
    # method (which calls the patched check above) answers every resume here.
    handlers.Continuation.resume = handlers._resume_py


def pytest_sessionfinish(session, exitstatus):
    if _seen["mismatches"]:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(
        f"speedups crosscheck: {_seen['checks']} tail checks, {len(_seen['mismatches'])} mismatches")
    for m in _seen["mismatches"][:20]:
        terminalreporter.write_line(f"  MISMATCH at {m[0]}:{m[1]}: compiled {m[2]}, python {m[3]}")
