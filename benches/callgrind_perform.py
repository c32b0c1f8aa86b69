"""Instruction counts of a `fun` perform vs a plain call (noise-free; run under callgrind).

    for mode in fun call; do for n in 10000 20000; do
      valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$mode.$n \
        .venv/bin/python benches/callgrind_perform.py $mode $n 2>&1 | grep Collected
    done; done

Per iteration = (count at 20,000 - count at 10,000) / 10,000; the ratio of the
two modes is the `fun` perform's cost in plain calls.
"""
import sys

from kina_fx import Effect, Handler, perform

E = Effect("callgrind.e")


def f(x):
    return x


def main(mode: str, n: int) -> None:
    if mode == "fun":
        with Handler(fun={E: f}):
            for i in range(n):
                perform(E, i)
    else:
        for i in range(n):
            f(i)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
