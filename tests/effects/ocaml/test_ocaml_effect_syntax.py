"""Ports of ocaml/ocaml ``testsuite/tests/effect-syntax/*.ml`` (Pretnar's tutorial, resumable
exceptions, iterators, shallow handlers on deep ones, coroutines, mixed cases).

The mapping from OCaml to kina_fx these ports use: tests/support/ocaml.py.
"""
from __future__ import annotations


import pytest

from kina_fx import Handler, perform
from support.ocaml import Out, fresh, isprime, reraise, run_state


# =============================================================================
# ocaml/ocaml testsuite/tests/effect-syntax
# (test1..test11 there are the effects/ programs above in the new syntax.)
# =============================================================================

# --- tutorial.ml (Pretnar's tutorial examples) ---------------------------------

def test_tutorial_print_handlers():
    Print = fresh("tutorial.Print")
    out = Out()

    def print_(s):
        perform(Print, s)

    def abc():
        print_("a")
        print_("b")
        print_("c")

    def output(f):
        def clause(k, s):
            out(s)
            return k.resume(None)
        return Handler(on={Print: clause}, ret=lambda _: out.line()).run(f)

    def reverse(f):
        def clause(k, s):
            k.resume(None)
            print_(s)  # performed by a clause: goes to the *outer* handler
        return Handler(on={Print: clause}, ret=lambda _: None).run(f)

    def collect(f):
        return Handler(on={Print: lambda k, s: s + k.resume(None)}, ret=lambda _: "").run(f)

    output(abc)
    output(lambda: reverse(abc))
    out.line(collect(abc))
    out.line(collect(lambda: reverse(abc)))
    assert out.text == "abc\ncba\nabc\ncba\n"


def test_tutorial_state_and_transactions():
    Get = fresh("tutorial.Get")
    Set = fresh("tutorial.Set")
    out = Out()

    def get():
        return perform(Get)

    def set_(n):
        perform(Set, n)

    def incr():
        set_(get() + 1)

    def prog1():
        out(f"{get()} ")
        incr()
        out(f"{get()} ")
        incr()
        out.line(f"{get()}")

    run_state(Get, Set, prog1)(10)

    class Abort(Exception):
        pass

    def transaction(f):
        h = Handler(ret=lambda _: (lambda s: set_(s)),
                    exc=lambda e: (lambda _s: None) if isinstance(e, Abort) else reraise(e),
                    on={Get: lambda k: (lambda s: k.resume(s)(s)),
                        Set: lambda k, n: (lambda _s: k.resume(None)(n))})
        return h.run(f)(get())

    def prog2():
        out(f"{get()} ")
        transaction(lambda: (incr(), incr()))
        out(f"{get()} ")

        def aborted():
            incr()
            raise Abort
        transaction(aborted)
        out(f"{get()} ")
        transaction(lambda: (incr(), incr()))
        out.line(f"{get()}")

    run_state(Get, Set, prog2)(10)
    assert out.text == "10 11 12\n10 12 12 14\n"


# --- resume_exn.ml: resumable exceptions (also with a tail-resumptive `fun` clause)

@pytest.mark.parametrize("style", ["on", "fun", "with"])
def test_resume_exn(style):
    Conversion_failure = fresh("resume_exn.Conversion_failure")
    out = Out()

    def int_of_string(s):
        try:
            return int(s)
        except ValueError:
            return perform(Conversion_failure, s)

    def sum_stringlist(l):
        return sum(int_of_string(s) for s in l)

    def replace(s):
        out.line(f"Bad input {s}, replaced with 0")
        return 0

    data = ["1", "xxx", "2", "yyy", "3"]
    if style == "on":
        def clause(k, s):
            return k.resume(replace(s))
        total = Handler(on={Conversion_failure: clause}).run(sum_stringlist, data)
    elif style == "fun":
        total = Handler(fun={Conversion_failure: replace}).run(sum_stringlist, data)
    else:
        with Handler(fun={Conversion_failure: replace}):
            total = sum_stringlist(data)
    out.line(f"Sum is: {total}")
    assert out.text == ("Bad input xxx, replaced with 0\n"
                        "Bad input yyy, replaced with 0\n"
                        "Sum is: 6\n")


# --- iterators.ml: primes by control inversion; same fringe --------------------

def _iterator_to_sequence(iter_):
    """iterators.ml's iterator_to_sequence: Seq.t as thunk -> None | (x, thunk)."""
    def gen(coll):
        Next = fresh("iterators.Next")
        return lambda: Handler(ret=lambda _: None,
                               on={Next: lambda k, elt: (elt, lambda: k.resume(None))}
                               ).run(iter_, lambda elt: perform(Next, elt), coll)
    return gen


def _seq_take(n, s):
    res = []
    while n > 0:
        node = s()
        if node is None:
            break
        x, s = node
        res.append(x)
        n -= 1
    return res


def _same_sequences(s1, s2):
    while True:
        a, b = s1(), s2()
        if a is None or b is None:
            return True  # Seq.for_all2 stops at the shorter sequence
        if a[0] != b[0]:
            return False
        s1, s2 = a[1], b[1]


def test_iterators_gen_primes():
    Next_prime = fresh("iterators.Next_prime")

    def iter_primes(f):
        n = 2
        while True:
            if isprime(n):
                f(n)
            n += 1

    def gen_primes():
        return Handler(ret=lambda _: None,
                       on={Next_prime: lambda k, n: (n, lambda: k.resume(None))}
                       ).run(iter_primes, lambda n: perform(Next_prime, n))

    expected = [n for n in range(2, 600) if isprime(n)][:100]
    assert _seq_take(100, gen_primes) == expected


def test_iterators_same_fringe():
    def list_iter(f, l):
        for x in l:
            f(x)

    def set_iter(f, s):
        for x in sorted(s):
            f(x)

    s1 = _iterator_to_sequence(list_iter)([1, 2, 3])
    s2 = _iterator_to_sequence(set_iter)({2, 1, 3})
    assert _same_sequences(s1, s2)
    s3 = _iterator_to_sequence(list_iter)([1, 5, 3])
    s4 = _iterator_to_sequence(set_iter)({2, 1, 3})
    assert not _same_sequences(s3, s4)


# --- shallow2deep.ml: Pottier's shallow handlers on top of deep ones -----------

def test_shallow2deep():
    E = fresh("shallow2deep.E")
    out = Out()

    # event = ("Ret", x) | ("Eff", op, k)
    def reify(m):
        return Handler(ret=lambda x: ("Ret", x), on={E: lambda k, op: ("Eff", op, k)}).run(m)

    def yield_(x):
        perform(E, ("Yield", x))

    def await_():
        return perform(E, ("Await",))

    class ProducerPushedTooFar(Exception):
        pass

    def zero_producer():
        raise ProducerPushedTooFar

    def zero_consumer():
        return "I need no data."

    def test_producer():
        yield_(1)
        yield_(2)
        raise ProducerPushedTooFar

    def test_consumer():
        x = await_()
        y = await_()
        return f"I have received {x} and {y}."

    def run_consumer(p, c):
        if c[0] == "Ret":
            return c[1]
        _, op, k = c
        assert op[0] == "Await", "consumer must not yield"
        return run_producer(p, k.resume)

    def run_producer(p, c):
        ev = p()
        assert ev[0] != "Ret", "producer must not stop early"
        _, op, k = ev
        assert op[0] == "Yield", "producer must not await"
        return run_consumer(lambda: k.resume(None), c(op[1]))

    def pipe(p, c):
        return run_consumer(lambda: reify(p), reify(c))

    out.line(pipe(test_producer, test_consumer))
    out.line(pipe(zero_producer, zero_consumer))
    try:
        r = pipe(zero_producer, test_consumer)
    except ProducerPushedTooFar:
        r = "Producer pushed too far."
    out.line(r)
    assert out.text == ("I have received 1 and 2.\n"
                        "I need no data.\n"
                        "Producer pushed too far.\n")


# --- coroutines.ml: spawn/yield/terminate/send/recv; Eratosthenes pipeline -----

class _Coroutines:
    def __init__(self):
        self.Spawn = fresh("coroutines.Spawn")
        self.Yield = fresh("coroutines.Yield")
        self.Send = fresh("coroutines.Send")
        self.Recv = fresh("coroutines.Recv")
        self.runnable = []

    class Terminate(Exception):
        pass

    @staticmethod
    def new_channel():
        return {"senders": [], "receivers": []}

    def spawn(self, f):
        perform(self.Spawn, f)

    def yield_(self):
        perform(self.Yield)

    def send(self, ch, v):
        perform(self.Send, ch, v)

    def recv(self, ch):
        return perform(self.Recv, ch)

    def suspend(self, f):
        self.runnable.append(f)

    def restart(self):
        if self.runnable:
            return self.runnable.pop(0)()
        return None

    def corun(self, f):
        def on_spawn(k, g):
            self.suspend(lambda: k.resume(None))
            return self.corun(g)

        def on_yield(k):
            self.suspend(lambda: k.resume(None))
            return self.restart()

        def on_send(k, ch, v):
            if ch["receivers"]:
                rc = ch["receivers"].pop(0)
                self.suspend(lambda: k.resume(None))
                return rc.resume(v)
            ch["senders"].append((v, k))
            return self.restart()

        def on_recv(k, ch):
            if ch["senders"]:
                v, sn = ch["senders"].pop(0)
                self.suspend(lambda: sn.resume(None))
                return k.resume(v)
            ch["receivers"].append(k)
            return self.restart()

        def exnc(e):
            if isinstance(e, self.Terminate):
                return self.restart()
            raise e

        return Handler(on={self.Spawn: on_spawn, self.Yield: on_yield,
                           self.Send: on_send, self.Recv: on_recv},
                       ret=lambda _: self.restart(), exc=exnc).run(f)


def test_coroutines_tasks_and_channel():
    co = _Coroutines()
    out = Out()

    def task(name, n):
        for i in range(1, n + 1):
            if i >= 7:
                raise co.Terminate
            out(f"{name}{i} ")
            co.yield_()

    co.corun(lambda: (co.spawn(lambda: task("a", 8)), co.spawn(lambda: task("b", 3)),
                      co.spawn(lambda: task("c", 4))))
    out.line()
    ch = co.new_channel()

    def main():
        co.spawn(lambda: co.send(ch, "a"))
        co.spawn(lambda: co.send(ch, "b"))
        out(f"{co.recv(ch)} ")
        out.line(co.recv(ch))

    co.corun(main)
    assert out.text == "a1 b1 a2 c1 b2 a3 c2 b3 a4 c3 a5 c4 a6 \na b\n"


def test_coroutines_eratosthenes():
    co = _Coroutines()
    out = Out()

    def eratosthenes(inp):
        p = co.recv(inp)
        out(f"{p} ")
        output = co.new_channel()
        co.spawn(lambda: eratosthenes(output))
        while True:
            n = co.recv(inp)
            if n % p != 0:
                co.send(output, n)

    def main():
        ints = co.new_channel()
        co.spawn(lambda: eratosthenes(ints))
        for i in range(2, 1001):
            co.send(ints, i)

    co.corun(main)
    out.line()
    primes = [n for n in range(2, 1001) if isprime(n)]
    assert out.text == " ".join(map(str, primes)) + " \n"


# --- mixed.ml: value, exception and effect cases sharing one result ------------

def test_mixed_cases():
    A = fresh("mixed.A")
    B = fresh("mixed.B")

    class Exn(Exception):
        def __init__(self, n):
            super().__init__(n)
            self.n = n

    def test(f):
        return Handler(ret=lambda n: n, exc=lambda e: e.n if isinstance(e, Exn) else reraise(e),
                       on={A: lambda _k, n: n, B: lambda _k, n: n}).run(f)

    assert test(lambda: 1) == 1
    assert test(lambda: (_ for _ in ()).throw(Exn(5))) == 5
    assert test(lambda: perform(A, 2)) == 2
    assert test(lambda: perform(B, 3)) == 3
