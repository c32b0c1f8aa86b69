"""Multi-shot continuations by replay (kina_fx.multishot): each result is checked
against an independent computation (a plain recursive solver, brute-force
enumeration), never against a constant."""
import itertools
from fractions import Fraction

import pytest

from kina_fx import FORWARD, ContinuationAlreadyResumed, Effect, Handler, Unhandled, perform
from kina_fx.multishot import MultiContinuation, MultiHandler, ReplayDiverged

Choose = Effect("test.ms.choose")
Fail = Effect("test.ms.fail")
Flip = Effect("test.ms.flip")
Get = Effect("test.ms.get")
Put = Effect("test.ms.put")


def choose(xs):
    return perform(Choose, xs)


def fail():
    return perform(Fail)


def all_solutions(k, xs):
    out = []
    for x in xs:
        out.extend(k.resume(x))
    return out


def first_solution(k, xs):
    for x in xs:
        r = k.resume(x)
        if r is not None:
            return r
    return None


every = MultiHandler(on={Choose: all_solutions, Fail: lambda k: []}, ret=lambda v: [v])
first = MultiHandler(on={Choose: first_solution, Fail: lambda k: None})


# --- N-queens --------------------------------------------------------------------

def queens_by_effects(n):
    placed = []
    for row in range(n):
        col = choose(range(n))
        if any(c == col or abs(c - col) == row - r for r, c in enumerate(placed)):
            fail()
        placed.append(col)
    return tuple(placed)


def queens_plain(n, placed=()):
    if len(placed) == n:
        return [placed]
    row = len(placed)
    out = []
    for col in range(n):
        if not any(c == col or abs(c - col) == row - r for r, c in enumerate(placed)):
            out.extend(queens_plain(n, placed + (col,)))
    return out


def queens_brute_force(n):
    return [p for p in itertools.permutations(range(n))
            if all(abs(p[i] - p[j]) != j - i for i in range(n) for j in range(i + 1, n))]


def test_eight_queens_all_solutions_match_a_plain_solver_and_brute_force():
    got = every.run(queens_by_effects, 8)
    assert got == queens_plain(8)
    assert sorted(got) == sorted(queens_brute_force(8))
    assert len(got) == len(set(got)) == 92


def test_ten_queens_count_matches_a_plain_solver():
    assert len(every.run(queens_by_effects, 10)) == len(queens_plain(10))


def test_first_solution_backtracks_to_the_plain_solvers_first():
    assert first.run(queens_by_effects, 8) == queens_plain(8)[0]


# --- SICP exercise 4.42: the liars puzzle ----------------------------------------

GIRLS = ("betty", "ethel", "joan", "kitty", "mary")


def liars_statements(p):
    # Each girl made two statements, exactly one of them true.
    return [(p["kitty"] == 2, p["betty"] == 3),
            (p["ethel"] == 1, p["joan"] == 2),
            (p["joan"] == 3, p["ethel"] == 5),
            (p["kitty"] == 2, p["mary"] == 4),
            (p["mary"] == 4, p["betty"] == 1)]


def liars_by_amb():
    places = {}
    for girl in GIRLS:
        place = choose(range(1, 6))
        if place in places.values():
            fail()
        places[girl] = place
    if not all(a != b for a, b in liars_statements(places)):
        fail()
    return tuple(places[g] for g in GIRLS)


def test_sicp_4_42_liars_puzzle_matches_brute_force():
    brute = [perm for perm in itertools.permutations(range(1, 6))
             if all(a != b for a, b in liars_statements(dict(zip(GIRLS, perm))))]
    assert every.run(liars_by_amb) == brute
    assert len(brute) == 1


# --- exact discrete distribution by weighted enumeration -------------------------

def merge(into, dist, weight):
    for value, p in dist.items():
        into[value] = into.get(value, 0) + p * weight
    return into


def weighted_flip(k, p):
    return merge(merge({}, k.resume(True), p), k.resume(False), 1 - p)


def uniform(k, xs):
    out = {}
    for x in xs:
        merge(out, k.resume(x), Fraction(1, len(xs)))
    return out


Uniform = Effect("test.ms.uniform")
enumerate_dist = MultiHandler(on={Flip: weighted_flip, Uniform: uniform, Fail: lambda k: {}},
                              ret=lambda v: {v: Fraction(1)})


def dice_and_coins():
    """Roll a die; flip that many coins (heads with p = 1/3); observe at least one
    head; return (die, heads)."""
    die = perform(Uniform, range(1, 7))
    heads = sum(perform(Flip, Fraction(1, 3)) for _ in range(die))
    if heads == 0:
        perform(Fail)
    return die, heads


def normalized(dist):
    total = sum(dist.values())
    return {v: p / total for v, p in dist.items()}


def test_exact_distribution_matches_brute_force_enumeration():
    brute = {}
    for die in range(1, 7):
        for coins in itertools.product((True, False), repeat=die):
            heads = sum(coins)
            if heads == 0:
                continue
            p = Fraction(1, 6)
            for c in coins:
                p *= Fraction(1, 3) if c else Fraction(2, 3)
            brute[(die, heads)] = brute.get((die, heads), 0) + p
    got = enumerate_dist.run(dice_and_coins)
    assert normalized(got) == normalized(brute)
    assert sum(got.values()) == sum(brute.values()) < 1     # the mass kept by observe


# --- across C frames -------------------------------------------------------------

def test_choose_inside_sorted_key_is_a_real_re_execution():
    xs = [3, 1, 2]
    got = every.run(lambda: sorted(xs, key=lambda x: x * choose([1, -1])))
    expected = []
    for signs in itertools.product([1, -1], repeat=len(xs)):
        it = iter(signs)           # sorted calls key once per element, in order
        expected.append(sorted(xs, key=lambda x: x * next(it)))
    assert got == expected


def test_choose_inside_list_map():
    xs = [1, 2, 3]
    got = every.run(lambda: list(map(lambda x: x + choose([0, 10]), xs)))
    assert got == [[a + x for a, x in zip(xs, offs)]
                   for offs in itertools.product([0, 10], repeat=len(xs))]


def test_iterator_made_in_the_body_is_not_shared_between_shots():
    def body():
        it = iter(range(4))
        first_ = next(it)
        choose("ab")
        return [first_] + list(it)
    assert every.run(body) == [[0, 1, 2, 3], [0, 1, 2, 3]]


# --- the rules ---------------------------------------------------------------------

def test_side_effects_outside_effects_repeat_on_replay():
    seen = []

    def body():
        seen.append("start")
        return choose([1, 2, 3])
    assert every.run(body) == [1, 2, 3]
    assert seen == ["start"] * 3             # the first run, then one replay per later shot


def test_outer_effects_are_forwarded_once_and_replayed_from_the_record():
    cell = [0]
    puts = []

    def put(k, v):
        puts.append(v)
        cell[0] = v
        return k.resume(None)
    state = Handler(on={Get: lambda k: k.resume(cell[0]), Put: put})

    def body():
        perform(Put, perform(Get) + 1)       # before the choice: performed once
        x = choose([10, 20])
        perform(Put, perform(Get) + x)       # after it: once per branch
        return perform(Get)
    assert state.run(lambda: every.run(body)) == [11, 31]
    assert puts == [1, 11, 31]


def test_nondeterministic_body_is_detected():
    counter = [0]

    def body():
        counter[0] += 1
        choose(range(counter[0]))             # a different argument on each replay
        return choose("xy")
    with pytest.raises(ReplayDiverged, match="replaying perform #1"):
        every.run(body)


def test_body_ending_early_on_replay_is_detected():
    flag = [True]

    def body():
        if flag[0]:
            flag[0] = False
            choose("a")
            return choose("xy")
        return "short"
    with pytest.raises(ReplayDiverged, match="returned after 0 performs"):
        every.run(body)


def test_discontinue_is_multi_shot_too():
    def body():
        try:
            return ("value", choose([1]))
        except KeyError as e:
            return ("caught", e.args[0])

    def clause(k, xs):
        return [k.resume(xs[0]), k.discontinue(KeyError("a")), k.discontinue(KeyError("b")), k.resume(2)]
    assert MultiHandler(on={Choose: clause}).run(body) == [
        ("value", 1), ("caught", "a"), ("caught", "b"), ("value", 2)]


def test_exc_and_ret_clauses_apply_to_every_branch():
    def body():
        x = choose([0, 1, 2])
        return 10 // x
    h = MultiHandler(on={Choose: all_solutions}, ret=lambda v: [("ok", v)],
                     exc=lambda e: [("exc", type(e).__name__)])
    assert h.run(body) == [("exc", "ZeroDivisionError"), ("ok", 10), ("ok", 5)]


def test_fun_clauses_answer_once_per_perform_and_are_replayed():
    calls = []

    def ask():
        calls.append("ask")
        return len(calls)
    h = MultiHandler(on={Choose: all_solutions}, fun={Get: ask}, ret=lambda v: [v])
    assert h.run(lambda: perform(Get) * 100 + choose([1, 2]) + perform(Get) * 10) == [121, 132]
    assert calls == ["ask", "ask", "ask"]


def test_stored_continuation_resumed_after_the_run_and_more_than_once():
    box = []
    h = MultiHandler(on={Choose: lambda k, xs: box.append(k) or "suspended"})
    assert h.run(lambda: choose("ab") * 2) == "suspended"
    k = box[0]
    assert isinstance(k, MultiContinuation)
    assert k.resume("x") == "xx"
    assert k.resume("y") == "yy"          # a replay, answered "y" at the choice
    assert len(box) == 1                  # (the clause is not called again)
    assert k.resume("z") == "zz" and k.shots == 3


def test_one_shot_handlers_keep_their_error():
    def clause(k, xs):
        k.resume(xs[0])
        return k.resume(xs[1])
    with pytest.raises(ContinuationAlreadyResumed):
        Handler(on={Choose: clause}).run(lambda: choose([1, 2]))


def test_inner_one_shot_handlers_rerun_with_the_body():
    inner = Handler(on={Get: lambda k: k.resume(7)})
    assert every.run(lambda: inner.run(lambda: perform(Get) + choose([0, 1]))) == [7, 8]


def test_unhandled_effect_still_raised_at_the_perform_site():
    def body():
        x = choose([1, 2])
        try:
            perform(Put, x)
        except Unhandled as e:
            return ("unhandled", e.payload)
    assert every.run(body) == [("unhandled", (1,)), ("unhandled", (2,))]


def test_nested_multi_handlers():
    Pick = Effect("test.ms.pick")
    inner = MultiHandler(on={Pick: all_solutions}, ret=lambda v: [v])

    def body():
        a = choose("ab")
        return inner.run(lambda: a + perform(Pick, "xy") + choose("12"))
    # The outer choice made in branch x continues through the inner clause's loop
    # (which then performs the choice of branch y): a full cross product.
    assert every.run(body) == [[a + "x" + c1, a + "y" + c2]
                               for a in "ab" for c1 in "12" for c2 in "12"]


def test_deep_search_runs_on_fresh_stacks_not_into_recursion_error():
    def body(n):
        for _ in range(n):
            if choose([0, 1]) == 0:
                fail()
        return "all ones"
    assert first.run(body, 300) == "all ones"


def test_tail_resumes_of_the_first_shot_run_in_constant_stack():
    def body():
        return sum(choose([i]) for i in range(20_000))
    h = MultiHandler(on={Choose: lambda k, xs: k.resume(xs[0])})
    assert h.run(body) == sum(range(20_000))


# --- abort cleanup and exceptions, as with a one-shot Handler (issue 16) ----------
# A MultiHandler whose clauses use each continuation at most once must behave
# exactly as a Handler with the same clauses: these run both and compare.

class Stop(Exception):
    pass


def both_kinds(on=None, fun=None, ret=None, exc=None):
    return [Handler(on=on, fun=fun, ret=ret, exc=exc), MultiHandler(on=on, fun=fun, ret=ret, exc=exc)]


def test_clause_raising_without_resuming_aborts_the_body_before_the_exception_arrives():
    events = []

    def body():
        try:
            choose([1])
        finally:
            events.append("body finally")

    def clause(k, xs):
        raise Stop("stop")

    outcomes = []
    for h in both_kinds(on={Choose: clause}):
        events.clear()
        try:
            h.run(body)
        except Stop:
            events.append("caller sees Stop")
        outcomes.append(list(events))
    assert outcomes[1] == outcomes[0] == ["body finally", "caller sees Stop"]


def test_clause_raising_with_k_passed_to_a_helper_still_aborts_at_once():
    # The continuation (and its bound resume) referenced only by the frames of
    # the traceback is not "kept"; a continuation the exception carries is.
    events = []

    def body():
        try:
            choose([1])
        finally:
            events.append("finally")

    def helper(resume):
        raise Stop()

    class Carry(Exception):
        pass

    def carry(k, xs):
        raise Carry(k)

    for h in both_kinds(on={Choose: lambda k, xs: helper(k.resume)}):
        events.clear()
        try:
            h.run(body)
        except Stop:
            events.append("caller sees Stop")
        assert events == ["finally", "caller sees Stop"], h

    for h in both_kinds(on={Choose: carry}):
        events.clear()
        try:
            h.run(body)
        except Carry as e:
            events.append("caller sees Carry")
            assert e.args[0].resume(5) is None
        assert events == ["caller sees Carry", "finally"], h


def raiser(exc_type):
    def clause(*args):
        raise exc_type()
    return clause


@pytest.mark.parametrize("answer", ["outer discontinue", "outer fun raises", "own fun raises"])
@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, "CancelledError"])
def test_base_exception_answered_to_a_forwarded_effect_reaches_the_body_as_itself(answer, exc_type):
    if exc_type == "CancelledError":
        import asyncio
        exc_type = asyncio.CancelledError
    seen = []

    def body():
        try:
            perform(Get)
        except BaseException as e:
            seen.append(type(e))
            raise

    for cls in (Handler, MultiHandler):
        seen.clear()
        if answer == "own fun raises":
            inner, outer = cls(on={Choose: all_solutions}, fun={Get: raiser(exc_type)}), Handler()
        else:
            inner = cls(on={Choose: all_solutions})
            outer = (Handler(on={Get: lambda k: k.discontinue(exc_type)}) if answer == "outer discontinue"
                     else Handler(fun={Get: raiser(exc_type)}))
        with pytest.raises(exc_type):
            outer.run(inner.run, body)
        assert seen == [exc_type], cls


def test_abort_is_recorded_so_a_shot_captured_in_its_cleanup_replays_it():
    # Clause for Get drops k: the body is aborted (Unwind at the perform).  The
    # body catches it and chooses; the second shot replays the run, which must
    # meet the same Unwind at the same perform (not ReplayDiverged, which the
    # body's `except BaseException` would swallow).
    seen = []

    def body():
        try:
            perform(Get)
        except BaseException as e:
            seen.append(type(e).__name__)
        x = choose([1, 2])
        seen.append(x)
        return x

    h = MultiHandler(on={Get: lambda k: "dropped", Choose: lambda k, xs: [k.resume(x) for x in xs]})
    assert h.run(body) == "dropped"
    assert seen == ["Unwind", 1, "Unwind", 2]


def test_abort_cleanup_choice_resumed_twice_runs_the_cleanup_per_shot():
    events = []

    def body():
        try:
            perform(Get)
        finally:
            events.append(("cleanup", choose("ab")))

    def every_shot(k, xs):
        out = []
        for x in xs:
            try:
                out.append(k.resume(x))
            except BaseException as e:          # the abort's Unwind, after each cleanup
                out.append(type(e).__name__)
        return out

    h = MultiHandler(on={Get: lambda k: "dropped", Choose: every_shot})
    assert h.run(body) == "dropped"
    assert events == [("cleanup", "a"), ("cleanup", "b")]


def test_fun_clause_that_declines_forwards_the_effect_outward():
    # Found by the differential tests: the MultiHandler resumed the body with
    # FORWARD itself instead of passing the effect on.
    clauses = dict(on={Choose: all_solutions}, fun={Get: lambda: FORWARD}, ret=lambda v: [v])
    outer = Handler(fun={Get: lambda: 42})
    body = lambda: perform(Get) + choose([0, 1])        # noqa: E731
    assert outer.run(MultiHandler(**clauses).run, body) == [42, 43]
    with pytest.raises(Unhandled):
        MultiHandler(**clauses).run(body)


def test_exception_answered_inside_the_body_does_not_keep_an_inner_continuation():
    # Found by the differential tests: the record kept the exception a clause
    # of the body caught, and with its traceback the clause's frame and its k:
    # the inner handler's body, dropped by that clause, was not aborted (its
    # cleanup ran at collection, detached from the handlers: Unhandled).
    events = []

    def inner_clause(k, x):
        try:
            perform(Fail)                   # answered by the MultiHandler with Stop
        except Stop:
            return "inner caught Stop"      # k dropped: the inner body is aborted

    def body():
        try:
            perform(Choose, ())
        finally:
            events.append(("finally", perform(Get)))

    outer_kinds = [Handler, MultiHandler]
    for outer in outer_kinds:
        events.clear()
        h = outer(on={Fail: lambda k: k.discontinue(Stop())}, fun={Get: lambda: "outer answers"})
        events.append(h.run(Handler(on={Choose: inner_clause}).run, body))
        assert events == [("finally", "outer answers"), "inner caught Stop"], outer


def test_replays_raise_the_recorded_exceptions_again():
    # Each later shot meets, at the same perform, an exception of the same
    # class and arguments as the one the first run met.
    seen = []

    def body():
        try:
            perform(Fail)
        except Stop as e:
            seen.append(e.args)
        return choose([1, 2])

    h = MultiHandler(on={Fail: lambda k: k.discontinue(Stop("recorded")),
                         Choose: lambda k, xs: [k.resume(x) for x in xs]})
    assert h.run(body) == [1, 2]
    assert seen == [("recorded",), ("recorded",)]


@pytest.mark.parametrize("inner", ["multi", "deep"])
def test_an_exception_a_multihandler_forwarded_does_not_keep_an_inner_clauses_k(inner):
    # Found by the differential tests (random seeds): a MultiHandler whose fun
    # clause declined an effect that nothing outside handled threw the
    # Unhandled into its body from a frame that kept it while the body ran;
    # the exception's frames held an inner clause's k, which then looked kept
    # when that clause raised again, and its body's cleanup ran late, detached,
    # with no LOG handler left.
    A, C, LOG = Effect("test.ms.seam.a"), Effect("test.ms.seam.c"), Effect("test.ms.seam.log")
    events = []

    def helper(k):
        perform(A)                          # declined by the outer MultiHandler: Unhandled

    def clause(k):
        try:
            helper(k)
        finally:
            perform(LOG, "clause's finally")
            perform(A)                      # again: the first Unhandled is its __context__

    def body():
        try:
            perform(C)
        finally:
            perform(LOG, "body's finally")

    make = MultiHandler if inner == "multi" else Handler
    outer = MultiHandler(fun={A: lambda: FORWARD})
    logger = Handler(fun={LOG: events.append})
    try:
        logger.run(lambda: outer.run(lambda: make(on={C: clause}).run(body)))
    except Unhandled:
        events.append("caller sees Unhandled")
    assert events == ["clause's finally", "body's finally", "caller sees Unhandled"]
