"""``kina-fx demo``: a tour of kina_fx that prints what happens.

1. A cooperative scheduler built from three effects (fork, yield, and a
   discontinue of a task that overstays), OCaml's ``sched.ml`` in Python.
2. State + logging: two handlers stacked, one ``on`` (control) and one ``fun``
   (tail-resumptive), with the state forwarded through the logger.
3. Autograd on effects: a small MLP trained on scikit-learn's digits
   (when scikit-learn is installed; ``--quick`` skips it).
"""
from __future__ import annotations

import argparse
from collections import deque

from .. import Effect, Handler, perform

Fork = Effect("demo.fork")
Yield = Effect("demo.yield")
Get = Effect("demo.get")
Put = Effect("demo.put")
Log = Effect("demo.log")


class TimeSliceExceeded(Exception):
    """Raised (via discontinue) into a task that yielded too often."""


def scheduler_demo(max_slices: int = 3) -> list:
    """Round-robin tasks; a task that yields more than ``max_slices`` times is
    discontinued with TimeSliceExceeded.  Returns the event log."""
    events = []
    run_queue = deque()          # (continuation, slices used)

    def dequeue():
        if run_queue:
            k, used = run_queue.popleft()
            if used > max_slices:
                return k.discontinue(TimeSliceExceeded(f"after {used} slices"))
            return k.resume(None)
        return None

    def spawn(task, name):
        slices = [0]

        def on_yield(k):
            slices[0] += 1
            run_queue.append((k, slices[0]))
            return dequeue()

        def on_fork(k, child):
            run_queue.append((k, slices[0]))
            return spawn(*child)

        def on_exception(exc):
            events.append(f"{name}: stopped by {type(exc).__name__} ({exc})")
            return dequeue()

        handler = Handler(on={Yield: on_yield, Fork: on_fork},
                          ret=lambda _: dequeue(), exc=on_exception)
        return handler.run(task)

    def worker(name, steps):
        def task():
            try:
                for i in range(steps):
                    events.append(f"{name}: step {i}")
                    perform(Yield)
                events.append(f"{name}: done")
            finally:
                events.append(f"{name}: cleanup")
        return task, name

    def main():
        events.append("main: forking a, b, c")
        perform(Fork, worker("a", 2))
        perform(Fork, worker("b", 3))
        perform(Fork, worker("c", 10))   # will be discontinued
        events.append("main: done forking")

    spawn(main, "main")
    return events


def state_and_logging_demo() -> tuple:
    """A counter kept by a state handler, with every access logged by a
    tail-resumptive logger installed inside it."""
    log = []

    def counter():
        for _ in range(3):
            perform(Put, perform(Get) + 1)
        return perform(Get)

    def logged(body):
        def get_logged():
            value = perform(Get)        # a fun clause runs outside its handler:
            log.append(f"get -> {value}")  # this reaches the state handler
            return value

        def put_logged(value):
            log.append(f"put {value}")
            return perform(Put, value)
        with Handler(fun={Get: get_logged, Put: put_logged}):
            return body()

    cell = [10]

    def put(k, v):
        cell[0] = v
        return k.resume(None)
    state = Handler(on={Get: lambda k: k.resume(cell[0]), Put: put},
                    ret=lambda v: (v, cell[0]))
    result = state.run(logged, counter)
    return result, log


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kina-fx demo", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the autograd training demo")
    args = parser.parse_args(argv)

    print("== 1. cooperative scheduler (fork / yield / discontinue) ==")
    for line in scheduler_demo():
        print("  " + line)

    print("\n== 2. state + logging (an 'on' handler with a 'fun' handler inside) ==")
    result, log = state_and_logging_demo()
    for line in log:
        print("  log: " + line)
    print(f"  result, final state = {result}")

    if not args.quick:
        print("\n== 3. autograd on effects: an MLP on scikit-learn's digits ==")
        try:
            from . import mlp as demo_mlp
        except ImportError as exc:      # the autograd demo needs the 'demo' extra
            print(f"  skipped: {exc}")
        else:
            demo_mlp.main([])
            print("\n== 4. differentiable compiled code: the same MLP, forward pass in MLIR ==")
            from . import compiled as demo_compiled
            demo_compiled.main([])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
