"""Differential checks (hypothesis) against direct models of OCaml's semantics: ``on`` /
``fun`` / ``with`` clauses, a sched.ml-style scheduler, shallow vs deep state, inverted
iterators vs Python generators.

The mapping from OCaml to kina_fx these ports use: tests/support/ocaml.py.
"""
from __future__ import annotations


import pytest

from kina_fx import Effect, Handler, Unhandled, perform
from support.ocaml import fresh, handle_state, run_state


# --- differential check: `on` vs `fun` vs `with` vs a model --------------------
# OCaml has only `on`-style clauses.  kina_fx documents a `fun` clause `g` as
# meaning `match g x with v -> continue k v | exception e -> discontinue k e`.
# Random handler stacks (clauses that re-perform other effects outwards or raise,
# ret and exc clauses) run with every level in each style and must agree with a
# direct model of deep-handler semantics.

_EFFS = ["a", "b", "c"]


class _Boom(Exception):
    def __init__(self, v):
        super().__init__(v)
        self.v = v


class _ModelUnhandled(Exception):
    pass


def _model(levels, body):
    def answer(e, x, top):
        for j in range(top - 1, -1, -1):
            clause = levels[j]["clauses"].get(e)
            if clause is not None:
                mul, add, then = clause
                if then == "raise":
                    raise _Boom(x + add)
                y = answer(then, x, j) if then else x
                return y * mul + add
        raise _ModelUnhandled(e)

    def run_level(j):
        if j == len(levels):
            return sum(answer(e, x, j) for e, x in body)
        try:
            r = run_level(j + 1)
        except _Boom as b:
            if levels[j]["exc"] is None:
                raise
            return levels[j]["exc"] + b.v
        return r * 2 + levels[j]["ret"]

    try:
        return run_level(0)
    except _Boom as b:
        return ("boom", b.v)
    except _ModelUnhandled as u:
        return ("unhandled", u.args[0])


def _run_styles(levels, body, styles, effs):
    def clause_fn(mul, add, then):
        def compute(x):
            if then == "raise":
                raise _Boom(x + add)
            y = perform(effs[then], x) if then else x
            return y * mul + add
        return compute

    def on_clause(fn):
        def clause(k, x):
            try:
                v = fn(x)
            except Exception as e:
                return k.discontinue(e)
            return k.resume(v)
        return clause

    def run_level(j):
        if j == len(levels):
            return sum(perform(effs[e], x) for e, x in body)
        lv = levels[j]
        fns = {effs[e]: clause_fn(*c) for e, c in lv["clauses"].items()}
        ret_add, exc_add = lv["ret"], lv["exc"]

        def exc(e):
            if exc_add is None or not isinstance(e, _Boom):
                raise e
            return exc_add + e.v

        style = styles[j]
        if style == "on":
            on = {eff: on_clause(fn) for eff, fn in fns.items()}
            return Handler(on=on, ret=lambda r: r * 2 + ret_add, exc=exc).run(run_level, j + 1)
        if style == "fun":
            return Handler(fun=fns, ret=lambda r: r * 2 + ret_add, exc=exc).run(run_level, j + 1)
        try:
            with Handler(fun=fns):
                r = run_level(j + 1)
        except _Boom as b:
            return exc(b)
        return r * 2 + ret_add

    try:
        return run_level(0)
    except _Boom as b:
        return ("boom", b.v)
    except Unhandled as u:
        return ("unhandled", u.effect.name.rsplit(".", 2)[-2])


def test_on_fun_with_agree_with_model():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    clause = st.tuples(st.integers(-3, 3), st.integers(-5, 5),
                       st.sampled_from([None, "raise"] + _EFFS))
    level = st.fixed_dictionaries({
        "clauses": st.dictionaries(st.sampled_from(_EFFS), clause, max_size=3),
        "ret": st.integers(-2, 2),
        "exc": st.one_of(st.none(), st.integers(100, 110))})
    program = st.tuples(st.lists(level, min_size=1, max_size=6),
                        st.lists(st.tuples(st.sampled_from(_EFFS), st.integers(-9, 9)),
                                 max_size=6),
                        st.data())
    effs = {e: Effect(f"ocaml_ports.diff.{e}.x") for e in _EFFS}

    @hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
    @hypothesis.given(program)
    def check(prog):
        levels, body, data = prog
        styles = data.draw(st.lists(st.sampled_from(["on", "fun", "with"]),
                                    min_size=len(levels), max_size=len(levels)))
        assert _run_styles(levels, body, styles, effs) == _model(levels, body), \
            (styles, levels, body)

    check()


# --- differential check: sched.ml-style scheduler vs a generator model ---------
# Random task trees (print / yield / fork / raise) run under the effects
# scheduler of sched.ml (fork runs the child first, exnc logs and goes on) and
# under the same scheduler written with Python generators; traces must match.

def _sched_with_effects(spec):
    Fork, Yield = fresh("dsched.Fork"), fresh("dsched.Yield")
    trace, run_q = [], []

    def task(actions):
        def go():
            for a in actions:
                if a[0] == "print":
                    trace.append(a[1])
                elif a[0] == "yield":
                    perform(Yield)
                elif a[0] == "fork":
                    perform(Fork, task(a[1]))
                else:
                    raise _Boom(a[1])
        return go

    def dequeue(*_):
        return run_q.pop(0).resume(None) if run_q else None

    def exnc(e):
        trace.append(("exn", e.v))
        return dequeue()

    def on_yield(k):
        run_q.append(k)
        return dequeue()

    def on_fork(k, f):
        run_q.append(k)
        return spawn(f)

    def spawn(f):
        return Handler(ret=dequeue, exc=exnc, on={Yield: on_yield, Fork: on_fork}).run(f)

    spawn(task(spec))
    return trace


def _sched_with_generators(spec):
    trace, run_q = [], []

    def task(actions):
        for a in actions:
            if a[0] == "print":
                trace.append(a[1])
            elif a[0] == "yield":
                yield ("yield",)
            elif a[0] == "fork":
                yield ("fork", a[1])
            else:
                raise _Boom(a[1])

    current = task(spec)
    while current is not None:
        try:
            op = next(current)
        except StopIteration:
            current = run_q.pop(0) if run_q else None
            continue
        except _Boom as b:
            trace.append(("exn", b.v))
            current = run_q.pop(0) if run_q else None
            continue
        run_q.append(current)
        current = task(op[1]) if op[0] == "fork" else run_q.pop(0)
    return trace


def test_scheduler_agrees_with_generator_model():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    leaf = st.one_of(st.tuples(st.just("print"), st.integers(0, 99)),
                     st.tuples(st.just("yield")),
                     st.tuples(st.just("raise"), st.integers(0, 9)))
    actions = st.recursive(st.lists(leaf, max_size=5),
                           lambda inner: st.lists(st.one_of(leaf, st.tuples(st.just("fork"), inner)),
                                                  max_size=5),
                           max_leaves=25)

    @hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
    @hypothesis.given(actions)
    def check(spec):
        assert _sched_with_effects(spec) == _sched_with_generators(spec)

    check()


# --- differential check: shallow state loop vs deep state vs plain Python --------

def test_shallow_and_deep_state_agree():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    ops = st.lists(st.one_of(st.tuples(st.just("get")), st.tuples(st.just("set"), st.integers(-50, 50)),
                             st.tuples(st.just("incr"))), max_size=40)
    Get, Set = fresh("sdstate.Get"), fresh("sdstate.Set")

    def prog(ops):
        seen = []
        for op in ops:
            if op[0] == "get":
                seen.append(perform(Get))
            elif op[0] == "set":
                perform(Set, op[1])
            else:
                perform(Set, perform(Get) + 1)
        return seen

    def plain(ops, init):
        s, seen = init, []
        for op in ops:
            if op[0] == "get":
                seen.append(s)
            elif op[0] == "set":
                s = op[1]
            else:
                s += 1
        return seen, s

    @hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
    @hypothesis.given(ops, st.integers(-5, 5))
    def check(ops, init):
        expected = plain(ops, init)
        shallow = handle_state(Get, Set, init, lambda _: prog(ops), None)
        deep = run_state(Get, Set, lambda: prog(ops))(init)
        assert shallow == expected
        assert deep == expected

    check()


# --- differential check: interleaved inverted iterators vs Python generators ----
# The manual's `invert`, with nested re-yielding, several sequences consumed in
# a random interleaving and some abandoned midway (their continuations are
# dropped and unwound).  Values and cleanup (finally blocks) must match the same
# producers written as Python generators (abandon = close()).

def test_interleaved_iterators_agree_with_generators():
    import random

    Y = fresh("interleave.Y")

    def invert(items, log, name):
        def it(f):
            try:
                for x in items:
                    if isinstance(x, list):
                        s = invert(x, log, name + "'")
                        while (node := s()) is not None:
                            v, s = node
                            f(v)
                    else:
                        f(x)
            finally:
                log.append(name)
        return lambda: Handler(ret=lambda _: None,
                               on={Y: lambda k, v: (v, lambda: k.resume(None))}
                               ).run(it, lambda v: perform(Y, v))

    def model(items, log, name):
        try:
            for x in items:
                if isinstance(x, list):
                    yield from model(x, log, name + "'")
                else:
                    yield x
        finally:
            log.append(name)

    def rand_items(rng, depth=0):
        return [rand_items(rng, depth + 1) if depth < 3 and rng.random() < 0.2
                else rng.randrange(100) for _ in range(rng.randrange(0, 6))]

    for seed in range(200):
        rng = random.Random(seed)
        specs = [rand_items(rng) for _ in range(rng.randrange(1, 5))]
        log_a, log_b, trace_a, trace_b = [], [], [], []
        seqs = {i: invert(sp, log_a, str(i)) for i, sp in enumerate(specs)}
        gens = {i: model(sp, log_b, str(i)) for i, sp in enumerate(specs)}
        for _ in range(rng.randrange(0, 30)):
            if not seqs:
                break
            i = rng.choice(sorted(seqs))
            if rng.random() < 0.1:  # abandon sequence i
                del seqs[i]  # not in a cycle: unwound right here, by refcount
                gens.pop(i).close()
                continue
            node = seqs[i]()
            if node is None:
                trace_a.append((i, None))
                del seqs[i]
            else:
                trace_a.append((i, node[0]))
                seqs[i] = node[1]
            node = None
            trace_b.append((i, next(gens[i], None)))
            if trace_b[-1][1] is None:
                del gens[i]
        seqs.clear()
        for g in gens.values():
            g.close()
        gens.clear()
        assert trace_a == trace_b, seed
        assert sorted(log_a) == sorted(log_b), seed
