"""Row blocks for the NumPy kernels: cache-sized pieces, spread over the process's cores.

NumPy's ufuncs and reductions release the GIL while they loop, so a few Python
threads each working through their own rows of an array run in parallel.
:func:`run_blocks` cuts an array's index space along one axis into blocks of
about :data:`BLOCK_BYTES` (so that a kernel's several passes over a block --
max, subtract, exp, sum, divide -- hit the core's cache instead of memory),
gives each worker thread a contiguous run of blocks and runs the first run on
the calling thread.  A kernel that makes one pass (``one_pass=True``: the
elementwise and binary ops) gains nothing from the cache and pays for every
block's Python call, so it gets one block per thread.

* Threads: ``KINA_FX_THREADS`` (an integer >= 1) or else every CPU the process
  may run on (``os.sched_getaffinity``).  One thread means no pool at all.
* Only NumPy work is split, and only past :data:`PARALLEL_MIN_ELEMENTS`:
  handing work to a thread costs tens of microseconds.  CuPy kernels are
  queued on the device's stream as one call (the ``xp`` of the caller says
  which).
* A worker runs its blocks under the caller's floating-point error state
  (``np.errstate`` is per thread), so an ABI call that silences warnings
  silences them in the workers too.
* A kernel called from a worker (nested) runs on that worker alone; after a
  ``fork`` the child builds its own pool.
"""
from __future__ import annotations

import os
import queue
import threading

import numpy as np

__all__ = ["BLOCK_BYTES", "PARALLEL_MIN_ELEMENTS", "thread_count", "run_blocks", "block_ranges",
           "thread_blocks"]


def _cache_block_bytes(default: int = 128 * 1024) -> int:
    """Half the per-core L2 cache Linux reports for CPU 0, within [64 KB, 1 MB]
    (a block of the input and one of the output fit together); ``default``
    where it reports none.  Blocks cost a Python call each: on a 1 MB L2 a
    softmax of 4096x4096 float32 took 19.7 ms in 128 KB blocks and 15.1 ms in
    512 KB ones (docs/benchmarks.md, target 3)."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for name in sorted(os.listdir(root)):
            with open(f"{root}/{name}/level") as level, open(f"{root}/{name}/type") as kind:
                if level.read().strip() != "2" or kind.read().strip() == "Instruction":
                    continue
            with open(f"{root}/{name}/size") as size:
                text = size.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            l2 = int(text.rstrip("KM")) * scale
            return min(1 << 20, max(64 << 10, l2 // 2))
    except (OSError, ValueError):
        pass
    return default


#: Bytes of one operand a block spans: a kernel's passes over a block stay in L2.
BLOCK_BYTES = _cache_block_bytes()
#: Arrays with fewer elements run as one block on the calling thread.
PARALLEL_MIN_ELEMENTS = 1 << 18


def thread_count() -> int:
    """Threads a kernel may use: ``KINA_FX_THREADS``, else the CPUs this process may run on."""
    value = os.environ.get("KINA_FX_THREADS")
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class _Pool:
    """Worker threads of one process; each takes (fn, errstate, done) jobs from its own queue."""

    def __init__(self, workers: int):
        self.pid = os.getpid()
        self.queues = []
        for _ in range(workers):
            q = queue.SimpleQueue()
            threading.Thread(target=self._work, args=(q,), daemon=True,
                             name="kina_fx-kernel").start()
            self.queues.append(q)

    @staticmethod
    def _work(q):
        _local.worker = True
        while True:
            fn, err, done = q.get()
            try:
                with np.errstate(**err):
                    fn()
                done.put(None)
            except BaseException as exc:  # handed to the caller, which raises it
                done.put(exc)


_local = threading.local()
_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _workers(want: int) -> _Pool | None:
    global _pool
    if want <= 1 or getattr(_local, "worker", False):
        return None
    pool = _pool
    if pool is None or pool.pid != os.getpid() or len(pool.queues) < want - 1:
        with _pool_lock:
            pool = _pool
            if pool is None or pool.pid != os.getpid() or len(pool.queues) < want - 1:
                pool = _pool = _Pool(want - 1)
    return pool


def block_ranges(extent: int, per_block: int) -> list:
    """``[(lo, hi), ...]`` covering ``range(extent)`` in steps of ``per_block``."""
    per_block = max(1, per_block)
    return [(lo, min(lo + per_block, extent)) for lo in range(0, extent, per_block)]


def thread_blocks(extent: int) -> list:
    """The blocks ``run_blocks(..., one_pass=True)`` cuts an axis of
    ``extent`` into: one per thread, as :func:`block_ranges` gives them."""
    return block_ranges(extent, -(-extent // thread_count()))


_WHOLE = tuple((slice(None),) * n for n in range(65))


def run_blocks(xp, shape, size: int, itemsize: int, split, body, one_pass: bool = False) -> list:
    """Call ``body(index)`` for blocks covering an array of ``shape`` (``size``
    elements), cut along axis ``split`` (None: one block); ``one_pass``: one
    block per thread (``body`` reads each element once: caching gains nothing).
    Returns what the calls returned, in block order.

    ``index`` is a tuple of slices selecting one block (every axis whole but
    ``split``).  The blocks are disjoint, so ``body`` may write its block of an
    output.  Small arrays, CuPy arrays and a single thread make one call with
    the whole index space.  ``body`` must do only NumPy work that is safe on
    any thread (no effects, no handler stack).
    """
    if size < PARALLEL_MIN_ELEMENTS or xp is not np or split is None:
        return [body(_WHOLE[len(shape)])]
    whole = _WHOLE[len(shape)]
    extent = shape[split]
    per_index = size // extent if extent else 0
    if one_pass:
        blocks = thread_blocks(extent)
    else:
        blocks = block_ranges(extent, max(1, BLOCK_BYTES // max(1, per_index * itemsize)))
    threads = min(thread_count(), len(blocks))
    pool = _workers(threads)
    head = whole[:split]
    tail = whole[split + 1:]

    results = [None] * len(blocks)

    def run(share):
        for k, (lo, hi) in share:
            results[k] = body(head + (slice(lo, hi),) + tail)

    numbered = list(enumerate(blocks))
    if pool is None:
        run(numbered)
        return results
    threads = min(threads, len(pool.queues) + 1)
    # Contiguous runs: each thread streams through its own part of memory.
    shares = [numbered[i * len(blocks) // threads:(i + 1) * len(blocks) // threads]
              for i in range(threads)]
    done = queue.SimpleQueue()
    err = np.geterr()
    for q, share in zip(pool.queues, shares[1:]):
        q.put(((lambda s=share: run(s)), err, done))
    failure = None
    try:
        run(shares[0])
    except BaseException as exc:
        failure = exc
    for _ in shares[1:]:
        exc = done.get()
        if failure is None and exc is not None:
            failure = exc
    if failure is not None:
        raise failure
    return results
