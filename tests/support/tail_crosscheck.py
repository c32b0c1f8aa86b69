"""Every tail-resume check of a test session answered twice (a pytest plugin).

With the compiled implementation, each check that the resume methods make is
answered by the compiled check (kina_fx/_speedups_c/tail.c) and by the Python
walk, ``tailcalls.returns_straight_to``, over the same driver frames (those the
compiled driver loop was called from); any difference fails the session.
tests/effects/conftest.py registers it when KINA_FX_TAIL_CROSSCHECK=1, which
tests/effects/test_speedups.py sets for a run of the effects suites.
"""
from kina_fx import fibers, handlers, tailcalls


class TailCrosscheck:
    def __init__(self):
        self.checks = 0
        self.mismatches = []

    def pytest_configure(self, config):
        speedups = fibers.speedups
        compiled = handlers._returns_straight_to_driver

        def both(frame):
            got = compiled(frame)
            want = tailcalls.returns_straight_to(frame, speedups.drives_from)
            self.checks += 1
            if got != want:
                self.mismatches.append((frame.f_code.co_filename, frame.f_lineno, got, want))
            return want

        # Test-only rewiring: the reference resume (which calls the module's
        # check, the one replaced here) answers every resume of the session.
        handlers._returns_straight_to_driver = both
        handlers.Continuation.resume = handlers._ContinuationReference.resume

    def pytest_sessionfinish(self, session):
        if self.mismatches:
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_line(
            f"tail crosscheck: {self.checks} tail checks, {len(self.mismatches)} mismatches")
        for m in self.mismatches[:20]:
            terminalreporter.write_line(f"  MISMATCH at {m[0]}:{m[1]}: compiled {m[2]}, python {m[3]}")
