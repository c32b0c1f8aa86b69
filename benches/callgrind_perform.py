"""Instruction counts of the effects runtime's Python-side operations and their
baselines (noise-free: run under callgrind; docs/benchmarks.md has the table).

    for mode in call fun switch tail generator; do for n in 10000 20000; do
      valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$mode.$n \\
        .venv/bin/python benches/callgrind_perform.py $mode $n 2>&1 | grep Collected
    done; done

Per operation = (count at 20,000 - count at 10,000) / 10,000.  Modes:

* ``call``: a plain Python call (the baseline of ``fun``);
* ``fun``: a perform answered by a ``fun`` clause;
* ``switch``: a raw greenlet switch round trip (the baseline of the next two);
* ``tail``: an ``on`` perform whose clause resumes in tail position
  (``return k.resume(x)``);
* ``generator``: an ``on`` perform whose clause returns ``k``; a loop outside
  resumes it (the generator pattern);
* ``run``: ``Handler.run`` of a trivial body under a handler with an ``on``
  clause (a fiber and a driver loop each time);
* ``nested``: an ``on`` perform whose clause resumes, then adds one (not in
  tail position: a driver loop nested in the clause each time).
"""
import sys

from greenlet import getcurrent, greenlet

from kina_fx import Effect, Handler, perform

E = Effect("callgrind.e")


def f(x):
    return x


def run_call(n):
    for i in range(n):
        f(i)


def run_fun(n):
    with Handler(fun={E: f}):
        for i in range(n):
            perform(E, i)


def run_switch(n):
    main = getcurrent()

    def child():
        while True:
            main.switch()
    g = greenlet(child)
    for _ in range(n):
        g.switch()


def run_tail(n):
    def body():
        for i in range(n):
            perform(E, i)
    Handler(on={E: lambda k, x: k.resume(x)}).run(body)


def run_generator(n):
    def body():
        for i in range(n):
            perform(E, i)
    step = Handler(on={E: lambda k, x: k}).run(body)
    while step is not None:
        step = step.resume(None)


def run_run(n):
    h = Handler(on={E: lambda k, x: k.resume(x)})

    def body():
        return 1
    for _ in range(n):
        h.run(body)


def run_nested(n):
    def body():
        for i in range(n):
            perform(E, i)
        return 0
    assert Handler(on={E: lambda k, x: k.resume(x) + 1}).run(body) == n


if __name__ == "__main__":
    globals()["run_" + sys.argv[1]](int(sys.argv[2]))
