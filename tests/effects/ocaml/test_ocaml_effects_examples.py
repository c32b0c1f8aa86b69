"""Ports of ocaml-multicore/effects-examples (generator, state, sched + concurrent, pipes,
reify_reflect, fringe, transaction, dyn_wind, promises, ref, mvar, eratosthenes,
algorithmic_differentiation, loop).

The mapping from OCaml to kina_fx these ports use: tests/support/ocaml.py.
"""
from __future__ import annotations


import pytest

from kina_fx import Handler, perform
from support.ocaml import Failure, Out, fresh, isprime, reraise


# =============================================================================
# ocaml-multicore/effects-examples
# =============================================================================

# --- generator.ml: tree iterator -> generator ----------------------------------

def test_examples_generator():
    # Tree: None | (left, value, right)
    def deep(n):
        t = None
        for level in range(1, n + 1):
            t = (t, level, t)
        return t

    def iter_tree(f, t):
        if t is None:
            return
        l, x, r = t
        iter_tree(f, l)
        f(x)
        iter_tree(f, r)

    def to_gen(t):
        Next = fresh("generator.Next")
        step = [None]

        def on_next(k, v):
            step[0] = lambda: k.resume(None)
            return v

        def start():
            def body():
                iter_tree(lambda x: perform(Next, x), t)
                return None
            return Handler(on={Next: on_next}).run(body)

        step[0] = start
        return lambda: step[0]()

    t = deep(12)
    expected = []
    iter_tree(expected.append, t)
    g = to_gen(t)
    got = []
    while (x := g()) is not None:
        got.append(x)
    assert got == expected and len(got) == 2 ** 12 - 1


# --- state.ml: two instances of a State functor, nested ------------------------

class _State:
    def __init__(self, name):
        self.Put = fresh(f"state.{name}.Put")
        self.Get = fresh(f"state.{name}.Get")

    def put(self, v):
        perform(self.Put, v)

    def get(self):
        return perform(self.Get)

    def run(self, f, init):
        comp = Handler(ret=lambda x: (lambda s: (s, x)),
                       on={self.Put: lambda k, s2: (lambda _s: k.resume(None)(s2)),
                           self.Get: lambda k: (lambda s: k.resume(s)(s))}).run(f)
        return comp(init)


def test_examples_state():
    IS, SS = _State("IS"), _State("SS")
    out = Out()

    def foo():
        out.line(IS.get())
        IS.put(42)
        out.line(IS.get())
        IS.put(21)
        out.line(IS.get())
        SS.put("hello")
        out.line(SS.get())
        SS.put("world")
        out.line(SS.get())

    assert IS.run(lambda: SS.run(foo, ""), 0) == (21, ("world", None))
    assert out.text == "0\n42\n21\nhello\nworld\n"


# --- sched.ml + concurrent.ml: binary tree of forked tasks ---------------------

def test_examples_sched_concurrent():
    Fork = fresh("examples.sched.Fork")
    Yield = fresh("examples.sched.Yield")
    out = Out()

    def fork(f):
        perform(Fork, f)

    def yield_():
        perform(Yield)

    def run(main):
        run_q = []

        def dequeue(*_):
            if not run_q:
                return None
            return run_q.pop(0).resume(None)

        def exnc(e):
            out(repr(e))
            return dequeue()

        def on_yield(k):
            run_q.append(k)
            return dequeue()

        def on_fork(k, f):
            run_q.append(k)
            return spawn(f)

        def spawn(f):
            return Handler(ret=dequeue, exc=exnc, on={Yield: on_yield, Fork: on_fork}).run(f)

        return spawn(main)

    def f(id_, depth):
        out.line(f"Starting number {id_}")
        if depth > 0:
            out.line(f"Forking number {id_ * 2 + 1}")
            fork(lambda: f(id_ * 2 + 1, depth - 1))
            out.line(f"Forking number {id_ * 2 + 2}")
            fork(lambda: f(id_ * 2 + 2, depth - 1))
        else:
            out.line(f"Yielding in number {id_}")
            yield_()
            out.line(f"Resumed number {id_}")
        out.line(f"Finishing number {id_}")

    run(lambda: f(0, 2))
    expected = """Starting number 0
Forking number 1
Starting number 1
Forking number 3
Starting number 3
Yielding in number 3
Forking number 2
Starting number 2
Forking number 5
Starting number 5
Yielding in number 5
Forking number 4
Starting number 4
Yielding in number 4
Resumed number 3
Finishing number 3
Finishing number 0
Forking number 6
Starting number 6
Yielding in number 6
Resumed number 5
Finishing number 5
Finishing number 1
Resumed number 4
Finishing number 4
Finishing number 2
Resumed number 6
Finishing number 6
"""
    assert out.text == expected


def test_examples_sched_many_tasks_constant_stack():
    # 20_000 yields through a tail-resuming scheduler: no RecursionError.
    Fork = fresh("examples.sched2.Fork")
    Yield = fresh("examples.sched2.Yield")
    run_q = []
    counter = [0]

    def dequeue(*_):
        if not run_q:
            return "done"
        return run_q.pop(0).resume(None)

    def on_yield(k):
        run_q.append(k)
        return dequeue()

    def on_fork(k, f):
        run_q.append(k)
        return spawn(f)

    def spawn(f):
        return Handler(ret=dequeue, on={Yield: on_yield, Fork: on_fork}).run(f)

    def worker():
        for _ in range(5_000):
            counter[0] += 1
            perform(Yield)

    def main():
        for _ in range(4):
            perform(Fork, worker)

    assert spawn(main) == "done"
    assert counter[0] == 20_000


# --- pipes.ml: deep encoding of pipes (Kammar et al.) --------------------------

def test_examples_pipes():
    Await = fresh("pipes.Await")
    Yield = fresh("pipes.Yield")
    out = Out()

    def await_():
        return perform(Await)

    def yield_(s):
        perform(Yield, s)

    # prod: () -> (cons -> None); cons: s -> (prod -> None)
    def up(cons, m):
        return Handler(ret=lambda v: (lambda _cons: v), exc=reraise,
                       on={Yield: lambda k, s: (lambda cons: cons(s)(lambda: k.resume(None)))}
                       ).run(m)(cons)

    def down(prod, m):
        return Handler(ret=lambda v: (lambda _prod: v), exc=reraise,
                       on={Await: lambda k: (lambda prod: prod()(lambda s: k.resume(s)))}
                       ).run(m)(prod)

    def compose(d, u):  # d <+< u
        return lambda: down(lambda: (lambda cons: up(cons, u)), d)

    def pipe(d, u):  # d >+> u
        return compose(u, d)

    def produce_from(n):
        def p():
            i = n
            while True:
                yield_(i)
                i += 1
        return p

    def sum_to(n):
        def c():
            acc = 0
            while acc < n:
                acc += await_()
            yield_(acc)
        return c

    def skip(n):
        def c():
            for _ in range(n):
                await_()
            while True:
                yield_(await_())
        return c

    def printer():
        while True:
            out.line(await_())

    example = pipe(pipe(pipe(produce_from(0), skip(99)), sum_to(100)), printer)
    assert example() is None
    assert out.text == "199\n"


# --- reify_reflect.ml: monadic reflection (state and exception monads) ---------

def _rr(name, ret, bind):
    E = fresh(f"reify_reflect.{name}")

    def reify(f):
        return Handler(ret=ret, on={E: lambda k, m: bind(m, lambda a: k.resume(a))}).run(f)

    def reflect(m):
        return perform(E, m)

    return reify, reflect


def test_examples_reify_reflect():
    out = Out()
    # State monad: s -> (s, a)
    st_return = lambda v: (lambda s: (s, v))                               # noqa: E731
    st_bind = lambda m, k: (lambda s: (lambda sa: k(sa[1])(sa[0]))(m(s)))  # noqa: E731
    st_reify, st_reflect = _rr("State", st_return, st_bind)

    def put(v):
        return st_reflect(lambda _s: (v, None))

    def get():
        return st_reflect(lambda s: (s, s))

    def run_state(f, init):
        final, v = st_reify(f)(init)
        out.line(f"Final state: {final}")
        return v

    # Exception monad: ("Ok", v) | ("Exn", e)
    ex_bind = lambda m, k: k(m[1]) if m[0] == "Ok" else m  # noqa: E731
    ex_reify, ex_reflect = _rr("Exception", lambda v: ("Ok", v), ex_bind)

    def raise_(e):
        return ex_reflect(("Exn", e))

    def run_exception(m, catch):
        r = ex_reify(m)
        return r[1] if r[0] == "Ok" else catch(r[1])

    def state_example():
        initial = get()
        out.line(f"Initial state: {initial}")
        put(10)
        assert get() == 10
        put(get() + 1)
        assert get() == 11
        put(12)
        return ("Initial", initial), ("Final", get())

    def exception_example():
        out.line("Raising an exception")
        raise_(Failure("An error!"))
        out.line("This shouldn't be displayed")

    def combined_example():
        out.line(f"Initial state: {get()}")
        put(100)
        raise_(Failure("An error!"))
        put(200)

    def print_exception(e):
        out.line(f"Exception: {type(e).__name__}({e})")

    sep = "=" * 40
    assert run_state(state_example, 10) == (("Initial", 10), ("Final", 12))
    out.line(sep)
    run_exception(exception_example, print_exception)
    out.line(sep)
    run_exception(lambda: run_state(combined_example, 10), print_exception)
    out.line(sep)
    run_state(lambda: run_exception(combined_example, print_exception), 10)
    assert out.text == f"""Initial state: 10
Final state: 12
{sep}
Raising an exception
Exception: Failure(An error!)
{sep}
Initial state: 10
Exception: Failure(An error!)
{sep}
Initial state: 10
Exception: Failure(An error!)
Final state: 100
"""


# --- fringe.ml: same fringe by stepping two deep handlers ----------------------

def test_examples_fringe():
    Yield = fresh("fringe.Yield")

    # tree: ("Leaf", v) | ("Node", l, r)
    def walk(t):
        if t[0] == "Leaf":
            perform(Yield, t[1])
        else:
            walk(t[1])
            walk(t[2])

    def step(f):
        return Handler(ret=lambda _: "Done", exc=reraise,
                       on={Yield: lambda k, e: ("Yielded", e, k)}).run(f)

    def comparator(ltree, rtree):
        l = lambda: step(lambda: walk(ltree))  # noqa: E731
        r = lambda: step(lambda: walk(rtree))  # noqa: E731
        while True:
            a, b = l(), r()
            if a == "Done" and b == "Done":
                return True
            if a != "Done" and b != "Done":
                if a[1] != b[1]:
                    return False
                l = (lambda k=a[2]: k.resume(None))  # noqa: E731
                r = (lambda k=b[2]: k.resume(None))  # noqa: E731
                continue
            return False

    L = lambda v: ("Leaf", v)        # noqa: E731
    N = lambda a, b: ("Node", a, b)  # noqa: E731
    ex1 = N(L(1), N(L(2), L(3)))
    ex2 = N(N(L(1), L(2)), L(3))
    ex3 = N(N(L(3), L(2)), L(1))
    ex4, ex5 = L(42), L(41)
    pairs = [(ex1, ex2), (ex2, ex1), (ex1, ex3), (ex3, ex2), (ex4, ex4), (ex5, ex4)]
    res = ["same" if comparator(a, b) else "different" for a, b in pairs]
    assert res == ["same", "same", "different", "different", "same", "different"]


# --- transaction.ml: nested atomically with rollback ---------------------------

def test_examples_transaction():
    Update = fresh("transaction.Update")
    out = Out()

    class Ref:
        def __init__(self, v):
            self.v = v

    def assign(r, v):
        perform(Update, r, v)

    def atomically(f):
        def on_update(k, r, v):
            def g(rb):
                old = r.v
                r.v = v

                def rb2():
                    r.v = old
                    rb()
                return k.resume(None)(rb2)
            return g

        def exnc(e):
            def g(rb):
                rb()
                raise e
            return g

        comp = Handler(ret=lambda x: (lambda _rb: x), exc=exnc, on={Update: on_update}).run(f)
        return comp(lambda: None)

    class Res(Exception):
        def __init__(self, v):
            super().__init__(v)
            self.v = v

    def t0():
        r = Ref(10)
        out.line(f"T0: {r.v}")
        try:
            def t1():
                assign(r, 20)
                assign(r, 21)
                out.line(f"T1: Before abort {r.v}")
                raise Res(r.v)
            atomically(t1)
        except Res as e:
            out.line(f"T0: T1 aborted with {e.v}")
            out.line(f"T0: {r.v}")

    atomically(t0)
    assert out.text == "T0: 10\nT1: Before abort 21\nT0: T1 aborted with 21\nT0: 10\n"


# --- dyn_wind.ml: dynamic-wind by re-performing from the clause ---------------

def test_examples_dyn_wind():
    E = fresh("dyn_wind.E")
    out = Out()

    def dynamic_wind(before, thunk, after, effects):
        def clause_for(e):
            def clause(k, *args):
                after()
                res = perform(e, *args)  # forwarded: clauses run outside their handler
                before()
                return k.resume(res)
            return clause

        before()
        res = Handler(ret=lambda x: x, exc=lambda e: (after(), reraise(e)),
                      on={e: clause_for(e) for e in effects}).run(thunk)
        after()
        return res

    def foo():
        out.line("peform E")
        perform(E)
        out.line("peform E")
        perform(E)
        out.line("done")

    def handled(k):
        out.line("handled E")
        return k.resume(None)

    Handler(on={E: handled}).run(
        dynamic_wind, lambda: out.line("IN"), foo, lambda: out.line("OUT"), [E])
    # ("peform" is the original program's spelling)
    assert out.text == ("IN\npeform E\nOUT\nhandled E\nIN\npeform E\nOUT\nhandled E\n"
                        "IN\ndone\nOUT\n")


# --- promises.ml: promises with fork/wait on a run queue -----------------------

def test_examples_promises():
    Fork = fresh("promises.Fork")
    Wait = fresh("promises.Wait")
    out = Out()

    class Status:
        def __init__(self, kind, val=None):
            self.kind, self.val = kind, val  # Done v | Cancelled e | Waiting [tvars]

    def fork(f):
        return perform(Fork, f)

    def get(sr):
        while True:
            if sr.kind == "Done":
                return ("Ok", sr.val)
            if sr.kind == "Cancelled":
                return ("Error", sr.val)
            perform(Wait, sr)

    def get_val(sr):
        while True:
            if sr.kind == "Done":
                return sr.val
            if sr.kind == "Cancelled":
                raise sr.val
            perform(Wait, sr)

    def pure(v):
        return Status("Done", v)

    def ap(f, g):
        if f.kind == "Cancelled":
            return Status("Cancelled", f.val)
        if g.kind == "Cancelled":
            return Status("Cancelled", g.val)
        if f.kind == "Waiting":
            perform(Wait, f)
            r = get(f)
            return ap(Status("Done", r[1]), g) if r[0] == "Ok" else Status("Cancelled", r[1])
        if g.kind == "Done":
            return Status("Done", f.val(g.val))
        perform(Wait, g)
        r = get(g)
        return Status("Done", f.val(r[1])) if r[0] == "Ok" else Status("Cancelled", r[1])

    def run(main):
        run_q = []

        def enqueue(k, v):
            run_q.append(lambda: (k.resume(v), None)[1])

        def dequeue():
            if run_q:
                return run_q.pop(0)()
            return None

        def wake(sr, kind, val):
            assert sr.kind == "Waiting", "Impossible: finish/abort"
            waiters = sr.val
            sr.kind, sr.val = kind, val
            for tv in waiters:
                if tv[0] is not None:
                    k, tv[0] = tv[0], None
                    enqueue(k, None)

        def spawn(sr, f):
            def on_wait(k, sr2):
                assert sr2.kind == "Waiting", "Impossible: wait"
                sr2.val.insert(0, [k])
                return dequeue()

            def on_fork(k, f2):
                sr2 = Status("Waiting", [])
                enqueue(k, sr2)
                return spawn(sr2, f2)

            def retc(v):
                wake(sr, "Done", v)
                return dequeue()

            def exnc(e):
                wake(sr, "Cancelled", e)
                return dequeue()

            return Handler(ret=retc, exc=exnc, on={Wait: on_wait, Fork: on_fork}).run(f)

        sr = Status("Waiting", [])
        spawn(sr, main)
        return get(sr)

    def test1():
        x, y = pure(10), pure(20)
        z = ap(ap(pure(lambda a: lambda b: a + b), x), y)
        return get_val(z)

    r = run(test1)
    out.line(f"test1: {r[1]}" if r[0] == "Ok" else f"test1: error: {r[1]!r}")

    class Exit(Exception):
        pass

    def test2():
        def fx():
            out.line("test2: x")
            return 10

        def fy():
            out.line("test2: y")
            raise Exit

        def fz():
            out.line("test2: z")
            return 20

        x, y, z = fork(fx), fork(fy), fork(fz)

        def add3(a):
            return lambda b: lambda c: (out.line(f"test2: add {a} {b} {c}"), a + b + c)[1]

        return get_val(ap(ap(ap(pure(add3), x), y), z))

    r = run(test2)
    out.line(f"test2: {r[1]}" if r[0] == "Ok" else f"test2: error: {type(r[1]).__name__}")
    out.line("SUCCESS")
    assert out.text == ("test1: 30\ntest2: x\ntest2: y\ntest2: z\n"
                        "test2: error: Exit\nSUCCESS\n")


# --- ref.ml: dynamically allocated references over effect-based cells ---------

class _StPassingCell:
    """A cell whose get/set are effects handled by a state-passing handler."""

    def __init__(self):
        self.Get, self.Set = fresh("ref.cell.Get"), fresh("ref.cell.Set")

    def get(self):
        return perform(self.Get)

    def set(self, y):
        perform(self.Set, y)

    def run(self, init, main):
        return _State.run(self._as_state(), main, init)

    def _as_state(self):
        st = _State.__new__(_State)
        st.Get, st.Put = self.Get, self.Set
        return st


class _LocalMutVarCell:
    """A cell that is a local mutable variable."""

    def get(self):
        return self.v

    def set(self, y):
        self.v = y

    def run(self, init, main):
        self.v = init
        x = main()
        return self.v, x


def _record_heap(cell_cls):
    Ref = fresh("ref.record.Ref")

    def ref(init):
        return perform(Ref, init)

    def run(main):
        def on_ref(k, init):
            cell = cell_cls()
            return cell.run(init, lambda: k.resume({"get": cell.get, "set": cell.set}))[1]
        return Handler(on={Ref: on_ref}).run(main)

    return ref, (lambda r: r["get"]()), (lambda r, v: r["set"](v)), run


def _fcm_heap(cell_cls):
    Ref = fresh("ref.fcm.Ref")

    def ref(init):
        return perform(Ref, init)

    def run(main):
        def on_ref(k, init):
            Get, Set = fresh("ref.fcm.Get"), fresh("ref.fcm.Set")  # `fresh ()`
            cell = cell_cls()

            def inner():
                return Handler(on={Get: lambda k2: k2.resume(cell.get()),
                                   Set: lambda k2, y: k2.resume(cell.set(y))}
                               ).run(k.resume, (Get, Set))
            return cell.run(init, inner)[1]
        return Handler(on={Ref: on_ref}).run(main)

    return (ref, (lambda r: perform(r[0])), (lambda r, v: perform(r[1], v)), run)


@pytest.mark.parametrize("heap", [_fcm_heap, _record_heap], ids=["FCMBasedHeap", "RecordBasedHeap"])
@pytest.mark.parametrize("cell", [_StPassingCell, _LocalMutVarCell],
                         ids=["StPassing", "LocalMutVar"])
def test_examples_ref(heap, cell):
    ref, deref, assign, run = heap(cell)

    def main():
        fibs = ref([])
        a, b = ref(0), ref(1)
        for _ in range(11):
            fibsv, av, bv = deref(fibs), deref(a), deref(b)
            assign(fibs, [av] + fibsv)
            assign(a, bv)
            assign(b, av + bv)
        fibsv, av, bv = deref(fibs), deref(a), deref(b)
        return fibsv[0], av, bv

    assert run(main) == (55, 89, 144)


# --- algorithmic_differentiation.ml: reverse-mode AD, non-tail continue ------

def test_examples_algorithmic_differentiation():
    import math

    Add, Mult, Exp = fresh("ad.Add"), fresh("ad.Mult"), fresh("ad.Exp")

    class T:
        __slots__ = ("v", "d")

        def __init__(self, v):
            self.v, self.d = v, 0.0

        def __add__(self, other):
            return perform(Add, self, other)

        def __mul__(self, other):
            return perform(Mult, self, other)

    def exp(a):
        return perform(Exp, a)

    def on_add(k, a, b):
        x = T(a.v + b.v)
        k.resume(x)
        a.d += x.d
        b.d += x.d
        return x

    def on_mult(k, a, b):
        x = T(a.v * b.v)
        k.resume(x)
        a.d += b.v * x.d
        b.d += a.v * x.d
        return x

    def on_exp(k, a):
        x = T(math.exp(a.v))
        k.resume(x)
        a.d = x.d * math.exp(a.v)
        return x

    def seed(r):
        r.d = 1.0
        return r

    def run(f):
        Handler(ret=seed, on={Add: on_add, Mult: on_mult, Exp: on_exp}).run(f)

    def grad(f, x):
        x = T(x)
        run(lambda: f(x))
        return x.d

    def grad2(f, xy):
        x, y = T(xy[0]), T(xy[1])
        run(lambda: f(x, y))
        return x.d, y.d

    for x in map(float, range(11)):
        assert grad(lambda x: x + x * x * x, x) == 1.0 + 3.0 * x * x
        assert grad(lambda x: x * x + x * x * x, x) == 2.0 * x + 3.0 * x * x
        assert grad(lambda x: exp(x + x), x) == 2.0 * math.exp(x + x)
        for y in map(float, range(11)):
            assert grad2(lambda x, y: x * x * y * y * y * y, (x, y)) == \
                (2.0 * x * y * y * y * y, 4.0 * x * x * y * y * y)
            assert grad2(lambda x, y: exp(x * y), (x, y)) == \
                (y * math.exp(x * y), x * math.exp(x * y))


# --- mvar/sched.ml + mvar/MVar.ml + mvar/MVar_test.ml --------------------------

def test_examples_mvar():
    Fork, Yield = fresh("mvar.Fork"), fresh("mvar.Yield")
    Suspend, Resume = fresh("mvar.Suspend"), fresh("mvar.Resume")
    out = Out()

    def run(main):
        run_q = []

        def enqueue(t, v):
            run_q.append(lambda: t.resume(v))

        def dequeue(*_):
            if run_q:
                return run_q.pop(0)()
            return None

        def on_yield(k):
            enqueue(k, None)
            return dequeue()

        def on_fork(k, f):
            enqueue(k, None)
            return spawn(f)

        def on_suspend(k, f):
            f(k)
            return dequeue()

        def on_resume(k, k2, v):
            enqueue(k2, v)
            k.resume(None)  # `ignore (continue k ())`: not in tail position

        def spawn(f):
            return Handler(ret=dequeue, exc=reraise,
                           on={Yield: on_yield, Fork: on_fork,
                               Suspend: on_suspend, Resume: on_resume}).run(f)

        return spawn(main)

    # MVar: ("Full", v, [(v', k)...]) | ("Empty", [k...])
    mv = [("Empty", [])]

    def put(v):
        st = mv[0]
        if st[0] == "Full":
            perform(Suspend, lambda k: st[2].append((v, k)))
        elif not st[1]:
            mv[0] = ("Full", v, [])
        else:
            perform(Resume, st[1].pop(0), v)

    def take():
        st = mv[0]
        if st[0] == "Empty":
            return perform(Suspend, lambda k: st[1].append(k))
        _, v, q = st
        if not q:
            mv[0] = ("Empty", [])
            return v
        v2, t = q.pop(0)
        mv[0] = ("Full", v2, q)
        perform(Resume, t, None)
        return v

    def put_(x):
        out.line(f"Before put: {x}")
        put(x)
        out.line(f"After put: {x}")

    def get_():
        out.line("Before get")
        v = take()
        out.line(f"After get: {v}")
        return v

    def main():
        put_("1")
        perform(Fork, lambda: put_("2"))
        perform(Fork, lambda: put_("3"))
        for _ in range(3):
            perform(Fork, get_)

    run(main)
    assert out.text == """Before put: 1
After put: 1
Before put: 2
Before put: 3
Before get
After get: 1
Before get
After get: 2
After put: 2
Before get
After get: 3
After put: 3
"""


# --- eratosthenes.ml: processes with pids + a mailbox handler outside them -----
# Send/Recv travel through the process scheduler's handler (which does not name
# them) to the mailbox handler; the mailbox clauses are tail-resumptive, so the
# port also runs them as `fun` clauses, in a `with` block and via run().

@pytest.mark.parametrize("mailbox_style", ["on", "fun", "with"])
def test_examples_eratosthenes(mailbox_style):
    Spawn, Yield = fresh("era.Spawn"), fresh("era.Yield")
    Send, Recv = fresh("era.Send"), fresh("era.Recv")
    out = Out()
    STOP = "Stop"

    def spawn(p):
        return perform(Spawn, p)

    def yield_():
        perform(Yield)

    def send(pid, msg):
        perform(Send, pid, msg)
        yield_()

    def recv(pid):
        while True:
            m = perform(Recv, pid)
            if m is not None:
                return m
            yield_()

    def mailbox(f):
        boxes = {}

        def push(pid, msg):
            boxes.setdefault(pid, []).append(msg)

        def pop(pid):
            q = boxes.get(pid)
            return q.pop(0) if q else None

        if mailbox_style == "on":
            return Handler(on={Send: lambda k, pid, msg: k.resume(push(pid, msg)),
                               Recv: lambda k, who: k.resume(pop(who))}).run(f)
        h = Handler(fun={Send: push, Recv: pop})
        if mailbox_style == "fun":
            return h.run(f)
        with h:
            return f()

    def run(main):
        def go():
            run_q = []
            pid = [-1]

            def dequeue(*_):
                return run_q.pop(0)() if run_q else None

            def on_yield(k):
                run_q.append(lambda: k.resume(None))
                return dequeue()

            def on_spawn(k, p):
                run_q.append(lambda: k.resume(pid[0]))  # !pid read when resumed, as in OCaml
                return spawn_(p)

            def spawn_(f):
                pid[0] += 1
                return Handler(ret=dequeue, on={Yield: on_yield, Spawn: on_spawn}).run(f, pid[0])

            return spawn_(main)
        return go

    n = 101

    def generator(_pid):
        first = spawn(sieve)
        out(f"Primes in [2..{n}]: ")
        for i in range(2, n + 1):
            send(first, i)
        send(first, STOP)
        out("\n")

    def sieve(mypid):
        msg = recv(mypid)
        if msg == STOP:
            return
        myprime = msg
        out(f"{myprime} ")
        succ = None
        while True:
            msg = recv(mypid)
            if msg != STOP and msg % myprime != 0:
                if succ is None:
                    succ = spawn(sieve)
                send(succ, msg)
            elif msg == STOP:
                if succ is not None:
                    send(succ, STOP)
                return

    mailbox(run(generator))
    text = out.text
    assert text.startswith(f"Primes in [2..{n}]: ") and text.count("\n") == 1
    printed = [int(t) for t in text[len(f"Primes in [2..{n}]: "):].split()]
    assert printed == [q for q in range(2, n + 1) if isprime(q)]


# --- loop.ml: the handler answers Foo with a thunk that performs Foo again ------
# (OCaml loops forever in constant stack; the Python body nests one frame per
# round because `perform Foo ()` is not a tail call, so the port stops at 300.)

def test_examples_loop():
    Foo = fresh("loop.Foo")
    rounds = [0]

    def f():
        return perform(Foo)()

    def clause(k):
        rounds[0] += 1
        if rounds[0] > 300:
            return "stopped"  # drops k: unwound
        return k.resume(lambda: perform(Foo)())

    assert Handler(ret=lambda x: x, on={Foo: clause}).run(f) == "stopped"
    assert rounds[0] == 301


# --- generators inside generators (same effect at every level) ------------------

def test_nested_inverted_iterators_same_effect():
    Y = fresh("nested_gen.Y")

    def invert(iter_):
        return lambda: Handler(ret=lambda _: None,
                               on={Y: lambda k, v: (v, lambda: k.resume(None))}
                               ).run(iter_, lambda v: perform(Y, v))

    def seq_iter(seq, f):
        while (node := seq()) is not None:
            v, seq = node
            f(v)

    def tree_iter(t):
        def it(f):
            for x in t:
                if isinstance(x, list):
                    seq_iter(invert(tree_iter(x)), f)  # re-yield a child sequence
                else:
                    f(x)
        return it

    def flat(t):
        return [y for x in t for y in (flat(x) if isinstance(x, list) else [x])]

    t = [1, [2, [3, 4], 5], [[[6]]], 7]
    for i in range(150):
        t = [i, t, [i, [i]]]
    got = []
    seq_iter(invert(tree_iter(t)), got.append)
    assert got == flat(t)
