"""A rank that fails, exits, is killed, hangs or diverges never leaves the others waiting for ever.

The decisions (docs/distributed.md, "Faults"): an exception that leaves
``with dist.mpi()`` on one rank aborts the job (MPI_Abort, after writing the
traceback to stderr); every wait is bounded by the group's timeout
(CommunicationError, status 2); calls that differ between ranks are refused
on every rank (ValidationError) before any data moves.  Each case runs
tests/distributed/dist_worker.py's ``fault`` case under mpiexec and checks the
job ended, how, and well before the group's timeout where that is not the cause.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

LONG = {"DIST_TEST_TIMEOUT": "120"}     # a timeout that must not be what ends the job
QUICK = 40                               # seconds: the job must be over well before LONG


def _ended_early(launch, victim=1):
    """Over well before the timeout, the misbehaving rank having reached step 2,
    and no rank having finished step 2.  (Whether the other ranks printed their
    step 1 before the job ended is a race, so it is not checked.)"""
    assert launch.seconds < QUICK, f"took {launch.seconds:.1f} s:\n{launch.output}"
    assert f"rank {victim} finished step 1" in launch.output, launch.output
    assert "finished step 2" not in launch.output, launch.output


@pytest.mark.parametrize("n", [2, 4])
def test_an_exception_on_one_rank_aborts_the_job(mpirun, n):
    launch = mpirun(n, "fault", "raise", n - 1, env=LONG)
    _ended_early(launch, n - 1)
    assert launch.result.returncode != 0
    assert f"kina_fx.distributed: rank {n - 1} of {n} aborts the job" in launch.result.stderr
    assert "RuntimeError: rank failed on purpose in step 2" in launch.result.stderr


def test_sys_exit_inside_the_block_aborts_too(mpirun):
    launch = mpirun(2, "fault", "sys_exit", env=LONG)
    _ended_early(launch)
    assert launch.result.returncode != 0
    assert "SystemExit" in launch.result.stderr


@pytest.mark.parametrize("n,victim", [(2, 1), (4, 2), (4, 0)])
def test_a_rank_that_exits_mid_step_ends_the_job(mpirun, n, victim):
    """os._exit skips every Python cleanup: MPICH's mpiexec ends the others
    (its exit status is then the exiting rank's own, 0 here: see the docs)."""
    _ended_early(mpirun(n, "fault", "exit", victim, env=LONG), victim)


def test_a_killed_rank_ends_the_job(mpirun):
    launch = mpirun(4, "fault", "kill", 3, env=LONG)
    _ended_early(launch, 3)
    assert launch.result.returncode != 0


@pytest.mark.parametrize("check", ["1", "0"])
def test_a_rank_that_hangs_times_the_others_out(mpirun, check):
    """Caught by the call comparison's wait, or (check=False) by the data call's."""
    launch = mpirun(2, "fault", "hang", env={"DIST_TEST_TIMEOUT": "3", "DIST_TEST_CHECK": check})
    aborted = launch.seen("rank 0 of 2 aborts the job")
    assert aborted is not None and aborted < QUICK, launch.output
    assert launch.seconds < QUICK, launch.output
    assert "finished step 2" not in launch.output
    assert "CommunicationError" in launch.result.stderr
    assert "did not complete it within 3 s" in launch.result.stderr
    assert launch.result.returncode != 0


@pytest.mark.parametrize("mode,other", [("other_collective", "broadcast(root=0) of float64 (4,)"),
                                        ("other_shape", "all_reduce('sum') of float64 (5,)")])
def test_different_calls_are_refused_on_every_rank(mpirun, mode, other):
    launch = mpirun(2, "fault", mode, env=LONG)
    _ended_early(launch)
    assert launch.result.returncode != 0
    assert "the processes made different calls" in launch.result.stderr
    assert "rank 0: all_reduce('sum') of float64 (4,) as collective #1" in launch.result.stderr
    assert f"rank 1: {other} as collective #1" in launch.result.stderr


def test_a_timeout_is_status_2_and_the_group_then_refuses(mpirun):
    launch = mpirun(2, "timeout_caught", env={"DIST_TEST_TIMEOUT": "2", "DIST_TEST_ABORT": "0"})
    assert launch.seconds < QUICK, launch.output
    assert "rank 0 caught status 2: all_reduce" in launch.result.stdout, launch.output
    assert "did not complete it within 2 s" in launch.result.stdout
    assert "rank 0 then: barrier" in launch.result.stdout
    assert "unusable since an earlier failure" in launch.result.stdout


def test_without_abort_the_timeout_still_ends_the_job(mpirun):
    launch = mpirun(2, "fault", "raise", env={"DIST_TEST_TIMEOUT": "3", "DIST_TEST_ABORT": "0"})
    assert launch.seconds < QUICK, launch.output
    assert "aborts the job" not in launch.result.stderr
    assert "RuntimeError: rank failed on purpose" in launch.result.stderr
    assert "did not complete it within 3 s" in launch.result.stderr
    assert launch.result.returncode != 0
