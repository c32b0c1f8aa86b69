"""A reference semantics for kina_fx's effects (docs/effects.md), small enough
to check by reading, for the differential tests (tests/effects/test_differential.py).

Programs are a small AST (below).  The reference runs them by *effect trees*
(a free monad): evaluating an expression gives a tree that is either ``Done``
(a value), ``Fail`` (an exception) or ``Op`` (an effect performed, with the
continuation: a function from the perform's outcome to the rest of the tree).
A handler is a function from trees to trees; a continuation is an ordinary
closure, so it can be called once or many times, and nothing is stacks,
fibers, greenlets, replays or C.

State.  The only state is how often a clause has used its continuation (for
the one-shot check and the abort decision) and whether a host fiber was
cancelled.  It is passed along (``st``, and the ``cancelled`` argument of
:func:`host_fiber`), never mutated, and continuations capture it: a branch
taken twice by a multi-shot handler starts from the same state each time,
as kina_fx's replays re-create what the handled code creates.

Outcomes are ``("ok", value)`` or ``("err", Err)``.  Exceptions are ``Err``
values named after the Python class kina_fx raises (``"E1"``, ``"Unwind"``,
``"Unhandled"``...); each raise makes a new one (identity matters: an abort
swallows only its own ``Unwind``).

The program AST
---------------
Expressions (values are ints, strings and tuples):

``Lit(v)``                     ``v``
``Arg()``                      in a clause: the perform's argument (the value for
                               ``ret``, the exception's class name for ``exc``)
``Perform(e, n)``              ``perform(E, n)``
``CPerform(e, n)``             ``kina_perform`` through the C ABI: the answer
                               (an int64), or ``-status`` of the exception it
                               answered with (``Unwind`` is CANCELLED, 7), or
                               ``-6`` (KINA_STATUS_TYPE) for a non-int answer
``Seq(items)``                 the tuple of the items' values, in order
``Raise(name)``                raise ``E1``, ``E2`` (Exceptions) or ``Halt`` (a BaseException)
``TryFinally(body, final)``    ``try: body finally: final``
``TryExcept(body, catch, alt)``  ``try: body except catch as e: ("caught", name of e, alt)``;
                               ``catch`` is ``"E1"``, ``"Exception"`` or ``"BaseException"``
``Handle(kind, specs, body)``  ``body`` under a handler made from ``specs[0]``:
                               ``kind`` ``"deep"`` (a Handler: one-shot), ``"multi"``
                               (a MultiHandler: clauses may resume twice) or
                               ``"shallow"`` (``fiber(body).resume_with(None, h)``).
                               ``impl`` says how kina_fx runs a ``"deep"`` one
                               (``"handler"``, ``"multi"``, ``"async"``): the same semantics.
``CHandle(effects, mode, body)``  a C handler (``kina_push_handler``) answering
                               ``effects`` in place: ``"answer"`` ``3n + 1``,
                               ``"forward"`` (KINA_FORWARD), ``"fail"`` (status 1:
                               ``ValidationError`` at the perform)
``CFiber(catch, host, body)``  ``body`` on a C ABI fiber (``kina_fiber_create``)
                               catching ``catch``; its host answers each caught
                               perform with ``n + 7`` (``"answer"``) or cancels
                               the fiber at the first one (``"cancel"``).  The
                               fiber's entry returns the body's value as an
                               int64 (:func:`to_int64`), or ``-status`` of the
                               exception it ends with; the value is
                               ``("fiber", that)``, or ``("fiber", "cancelled")``.
``Resume(e)``, ``Discontinue(name)``  in an ``on`` clause: ``k.resume(e)``,
                               ``k.discontinue(name)`` (in a shallow one:
                               ``resume_with``/``discontinue_with`` the same handler)
``ResumeWith(e, j)``           in a shallow ``on`` clause: ``k.resume_with(e, specs[j])``
``Forward()``                  in a ``fun`` clause: decline (``FORWARD``)

Every run has an outermost handler: ``log`` appends its argument to the run's
log and answers 0; ``b`` answers ``n + 200`` and ``c`` ``n + 100``; ``a``
reaching it is Unhandled (raised at the perform).

A ``Spec`` has ``on`` and ``fun`` clauses (tuples of ``(effect, expr)``) and
optional ``ret`` and ``exc`` expressions; no spec names ``log``.  Continuations are only used in their own
clause, outside any ``Handle``, ``CHandle`` or ``CFiber`` nested in it.
"""
from __future__ import annotations

import collections
import itertools
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple


# --- the AST -------------------------------------------------------------------

@dataclass(frozen=True)
class Lit:
    value: Any


@dataclass(frozen=True)
class Arg:
    pass


@dataclass(frozen=True)
class Perform:
    effect: str
    arg: int


@dataclass(frozen=True)
class CPerform:
    effect: str
    arg: int


@dataclass(frozen=True)
class Seq:
    items: Tuple[Any, ...]


@dataclass(frozen=True)
class Raise:
    name: str


@dataclass(frozen=True)
class TryFinally:
    body: Any
    final: Any


@dataclass(frozen=True)
class TryExcept:
    body: Any
    catch: str
    alt: Any


@dataclass(frozen=True)
class Spec:
    on: Tuple[Tuple[str, Any], ...] = ()
    fun: Tuple[Tuple[str, Any], ...] = ()
    ret: Optional[Any] = None
    exc: Optional[Any] = None


@dataclass(frozen=True)
class Handle:
    kind: str
    specs: Tuple[Spec, ...]
    body: Any
    impl: str = "handler"


@dataclass(frozen=True)
class CHandle:
    effects: Tuple[str, ...]
    mode: str
    body: Any


@dataclass(frozen=True)
class CFiber:
    catch: Tuple[str, ...]
    host: str
    body: Any


@dataclass(frozen=True)
class Resume:
    value: Any


@dataclass(frozen=True)
class Discontinue:
    name: str


@dataclass(frozen=True)
class ResumeWith:
    value: Any
    spec: int


@dataclass(frozen=True)
class Forward:
    pass


#: How often each event of the semantics happened, over every run (what the
#: differential tests report, to show what the generated programs exercise).
EVENTS = collections.Counter()


# --- exceptions -------------------------------------------------------------------

_ids = itertools.count()

#: The classes of kina_fx and of the programs that are ``Exception``s (the rest,
#: ``Halt`` and ``Unwind``, are BaseExceptions only).
EXCEPTIONS = frozenset({"E1", "E2", "Unhandled", "ContinuationAlreadyResumed",
                        "ValidationError", "Cancelled", "KinaTypeError"})

#: The status a C export returns for each (kina_fx.errors.status_of).
STATUS = {"Unwind": 7, "Cancelled": 7, "Unhandled": 8, "ValidationError": 1,
          "ContinuationAlreadyResumed": 1, "KinaTypeError": 6}


@dataclass(eq=False)
class Err:
    name: str
    ident: int = field(default_factory=lambda: next(_ids))


def catches(catch: str, err: Err) -> bool:
    if catch == "BaseException":
        return True
    if catch == "Exception":
        return err.name in EXCEPTIONS
    return err.name == catch


def status(err: Err) -> int:
    return STATUS.get(err.name, 5)


def to_int64(value) -> int:
    """A host fiber's result: ints as they are, anything else by a stable hash."""
    if isinstance(value, int):
        return value
    return zlib.crc32(repr(value).encode())


# --- trees --------------------------------------------------------------------------

@dataclass(frozen=True)
class Done:
    value: Any
    st: int = 0


@dataclass(frozen=True)
class Fail:
    err: Err
    st: int = 0


@dataclass(frozen=True)
class Op:
    effect: str
    arg: int
    cont: Any             # outcome -> tree


FORWARD = ("<forward>",)


def tree(outcome, st):
    kind, x = outcome
    return Done(x, st) if kind == "ok" else Fail(x, st)


def bind(t, f):
    """The tree that runs ``t`` and then ``f(outcome, st)``."""
    if isinstance(t, Done):
        return f(("ok", t.value), t.st)
    if isinstance(t, Fail):
        return f(("err", t.err), t.st)
    return Op(t.effect, t.arg, lambda o: bind(t.cont(o), f))


def restore(t, st):
    """``t``, ending with the state ``st`` of the code around it."""
    return bind(t, lambda o, _: tree(o, st))


@dataclass(frozen=True)
class Env:
    arg: Any = None
    k: Any = None               # a clause's continuation: k(outcome, spec=None) -> tree
    one_shot: bool = True


# --- evaluation ---------------------------------------------------------------------

def ev(e, env: Env, st: int):
    """The tree of expression ``e``; ``st`` counts the uses of ``env.k``."""
    kind = type(e)
    if kind is Lit:
        return Done(e.value, st)
    if kind is Arg:
        return Done(env.arg, st)
    if kind is Forward:
        return Done(FORWARD, st)
    if kind is Perform:
        return Op(e.effect, e.arg, lambda o: tree(o, st))
    if kind is CPerform:
        return Op(e.effect, e.arg, lambda o: Done(c_answer(o), st))
    if kind is Raise:
        return Fail(Err(e.name), st)
    if kind is Seq:
        return _seq(e.items, 0, (), env, st)
    if kind is TryFinally:
        def after_body(o, st1):
            return bind(ev(e.final, env, st1),
                        lambda o2, st2: Fail(o2[1], st2) if o2[0] == "err" else tree(o, st2))
        return bind(ev(e.body, env, st), after_body)
    if kind is TryExcept:
        def after_body(o, st1):
            if o[0] == "err" and catches(e.catch, o[1]):
                name = o[1].name
                return bind(ev(e.alt, env, st1),
                            lambda o2, st2: Done(("caught", name, o2[1]), st2) if o2[0] == "ok"
                            else Fail(o2[1], st2))
            return tree(o, st1)
        return bind(ev(e.body, env, st), after_body)
    if kind is Handle:
        body = ev(e.body, Env(arg=env.arg), 0)
        return restore(handle(e.specs[0], body, e.kind, e.specs), st)
    if kind is CHandle:
        fun = tuple((eff, _CClause(e.mode)) for eff in e.effects)
        body = ev(e.body, Env(arg=env.arg), 0)
        return restore(handle(Spec(fun=fun), body, "deep", ()), st)
    if kind is _CClause:
        if e.mode == "answer":
            return Done(3 * env.arg + 1, st)
        if e.mode == "forward":
            return Done(FORWARD, st)
        return Fail(Err("ValidationError"), st)
    if kind is CFiber:
        entry = bind(ev(e.body, Env(arg=env.arg), 0),
                     lambda o, _: Done(to_int64(o[1]) if o[0] == "ok" else -status(o[1])))
        return restore(host_fiber(entry, e.catch, e.host, False), st)
    if kind is Resume or kind is ResumeWith:
        spec = e.spec if kind is ResumeWith else None
        return bind(ev(e.value, env, st),
                    lambda o, st1: use_k(env, ("ok", o[1]), st1, spec) if o[0] == "ok"
                    else Fail(o[1], st1))
    if kind is Discontinue:
        return use_k(env, ("err", Err(e.name)), st, None)
    raise TypeError(f"not an expression: {e!r}")


@dataclass(frozen=True)
class _CClause:
    mode: str


def _seq(items, i, values, env, st):
    if i == len(items):
        return Done(values, st)
    return bind(ev(items[i], env, st),
                lambda o, st1: _seq(items, i + 1, values + (o[1],), env, st1) if o[0] == "ok"
                else Fail(o[1], st1))


def c_answer(outcome):
    kind, x = outcome
    if kind == "err":
        return -status(x)
    return x if isinstance(x, int) else -6


def use_k(env, outcome, st, spec):
    """Resume or discontinue the clause's continuation: what the handler returns."""
    if env.one_shot and st > 0:
        EVENTS["one-shot continuation used again"] += 1
        return Fail(Err("ContinuationAlreadyResumed"), st)
    EVENTS["continuation used" if st == 0 else "multi-shot continuation used again"] += 1
    return restore(env.k(outcome, spec), st + 1)


# --- handlers -----------------------------------------------------------------------

def handle(spec: Spec, t, kind: str, specs):
    """Tree ``t`` under the handler ``spec`` (deep, multi-shot or shallow)."""
    if isinstance(t, Done):
        return Done(t.value) if spec.ret is None else ev(spec.ret, Env(arg=t.value), 0)
    if isinstance(t, Fail):
        if spec.exc is not None and t.err.name in EXCEPTIONS:
            return ev(spec.exc, Env(arg=t.err.name), 0)
        return Fail(t.err)
    fun, on = dict(spec.fun), dict(spec.on)

    def forwarded():
        return Op(t.effect, t.arg, lambda o: handle(spec, t.cont(o), kind, specs))

    if t.effect in fun:
        EVENTS["fun clause"] += 1
        # In place: the clause's own effects go outward; its value (or
        # exception) is the perform's; FORWARD declines.
        return bind(ev(fun[t.effect], Env(arg=t.arg), 0),
                    lambda o, _: forwarded() if o == ("ok", FORWARD)
                    else handle(spec, t.cont(o), kind, specs))
    if t.effect in on:
        def k(outcome, with_spec=None):
            if kind == "shallow":
                return handle(specs[with_spec] if with_spec is not None else spec,
                              t.cont(outcome), kind, specs)
            return handle(spec, t.cont(outcome), kind, specs)

        env = Env(arg=t.arg, k=k, one_shot=kind != "multi")
        EVENTS[f"{kind} on clause"] += 1

        def after_clause(o, uses):
            if uses:
                return tree(o, 0)
            # Abort cleanup: the clause did not use k: Unwind at the perform,
            # under this handler; its own Unwind coming back is swallowed, any
            # other outcome of the cleanup that is an exception wins.
            signal = Err("Unwind")
            EVENTS["abort"] += 1
            return bind(k(("err", signal)),
                        lambda o2, _: Fail(o2[1]) if o2[0] == "err" and o2[1] is not signal
                        else tree(o, 0))
        return bind(ev(on[t.effect], env, 0), after_clause)
    return forwarded()


def host_fiber(t, catch, host, cancelled):
    """Tree ``t`` (the entry's) on a C ABI fiber whose host answers ``catch``."""
    if isinstance(t, Done):
        return Done(("fiber", "cancelled" if cancelled else t.value))
    if isinstance(t, Fail):                 # the entry converts every exception
        raise AssertionError("a fiber entry cannot fail")
    if t.effect in catch:
        if host == "answer" and not cancelled:
            return host_fiber(t.cont(("ok", t.arg + 7)), catch, host, False)
        EVENTS["host fiber cancelled"] += 1
        return host_fiber(t.cont(("err", Err("Cancelled"))), catch, host, True)
    return Op(t.effect, t.arg, lambda o: host_fiber(t.cont(o), catch, host, cancelled))


# --- running a program -------------------------------------------------------------

#: The outermost handler of every run answers these effects with ``n + offset``
#: (and ``log``): ``a`` performed where nothing handles it is Unhandled.
WORLD = {"b": 200, "c": 100}


def run(program):
    """``(outcome, log)``: ``("returned", value)`` or ``("raised", class name)``,
    and the arguments of the ``log`` performs in order."""
    log = []
    t = ev(program, Env(), 0)
    while isinstance(t, Op):
        if t.effect == "log":
            log.append(t.arg)
            t = t.cont(("ok", 0))
        elif t.effect in WORLD:
            t = t.cont(("ok", t.arg + WORLD[t.effect]))
        else:
            EVENTS["unhandled"] += 1
            t = t.cont(("err", Err("Unhandled")))
    if isinstance(t, Done):
        return ("returned", t.value), log
    return ("raised", t.err.name), log
