"""Algebraic effects and handlers with OCaml 5 semantics, on kina_fx fibers.

The whole model in a few lines (docs/effects.md has the long version):

* ``perform(effect, *args)`` walks the handler stack of the running fiber chain
  (see :mod:`kina_fx.fibers`) from the innermost handler outwards and stops at
  the first handler with a clause for ``effect``.
* A ``fun`` clause is *tail-resumptive*: it runs right there, on the
  performer's stack, and its return value is the value of ``perform``.
* An ``on`` clause is a *control* clause: the fibers from the performer up to
  the handler's fiber are suspended as a one-shot :class:`Continuation`, and
  the clause runs in the context of whoever started (or last resumed) that
  handler, receiving ``k``.
* Every clause runs outside its own handler: effects performed by a clause go
  to handlers further out.  For control clauses that is automatic (they run
  on the resumer); for ``fun`` clauses a *skip marker* pushed for the duration
  of the clause makes the search jump past the handler.
* Deep handlers (``Handler.run``, ``k.resume``) stay installed on the fiber;
  shallow ones (``fiber(fn)``, ``k.resume_with``) handle one effect and are
  gone.

Tail resumption: ``return k.resume(v)`` at the end of a clause, possibly
through helpers that themselves ``return`` the call directly, does not nest
the clause's stack under the resumed fiber: it hands ``(k, v)`` back to the
loop that called the clause, which resumes ``k`` itself (as OCaml compiles a
``continue`` in tail position).  Clauses that resume in tail position
therefore run in constant stack, however many effects are performed.
"""
from __future__ import annotations

import re
import sys
import threading
from typing import (TYPE_CHECKING, Any, Callable, Concatenate, Generic, Iterable, Mapping, Optional,
                    ParamSpec, Tuple, TypeVar, Union)

from . import fibers, tailcalls
from .errors import Cancelled, ContinuationAlreadyResumed, Unhandled, ValidationError
from .fibers import RAISED, RETURNED, Chain, check_owner, data_type, local, thread_token
from .references import copied_into_frame_locals, dying_with_traceback

__all__ = ["Effect", "perform", "Handler", "Continuation", "fiber", "Stepper", "FORWARD",
           "push_handler", "pop_handler", "suspend_to_host", "thread_token", "check_owner"]

# The compiled implementation (kina_fx/_speedups_c/), or None for the
# pure-Python reference: fibers.py chooses, once.  Where it is not None this
# module uses its perform, switch_into, driver loop and tail check, and
# Continuation gets its resume and finalizer; docs/effects.md ("The
# compiled fast path") lists what it hands back to the Python functions here.
_speedups = fibers.speedups

PERFORMED = "performed"

# Type parameters (docs/effects.md, "Typed effects"): an Effect[P, R] is
# performed with arguments P and answers R; a Continuation[R, T] is resumed
# with an R and returns the handler's result T.
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


# --- effects ----------------------------------------------------------------


class Effect(Generic[P, R]):
    """An effect, interned by name: ``Effect("yield") is Effect("yield")``.

    ``id`` is a small positive int, stable for the life of the process and
    shared with the C ABI (``kina_effect_id``).  ``default``, when set, is a
    callable that answers the effect in place when no handler handles it
    (instead of raising :class:`Unhandled`).

    For type checkers an effect is generic over its parameters and its answer:
    ``Ask: Effect[[str], int] = Effect("ask")`` is performed with one ``str``
    and answers an ``int``; :func:`perform`, ``Ask(...)``, ``Ask.on(clause)``
    and ``Ask.fun(clause)`` are checked against that (docs/effects.md).  At
    run time the parameters are not checked and every ``Effect("ask")`` is the
    same object, whatever it is annotated with.
    """

    __slots__ = ("name", "id", "default", "__weakref__")
    _lock = threading.Lock()
    _by_name: dict = {}
    _by_id: list = [None]          # ids start at 1; 0 means "no effect" in C

    def __new__(cls, name: str) -> "Effect[P, R]":
        if not isinstance(name, str) or not name:
            raise ValidationError(f"an effect name must be a non-empty str, not {name!r}")
        effect = cls._by_name.get(name)
        if effect is None:
            with cls._lock:
                effect = cls._by_name.get(name)
                if effect is None:
                    effect = object.__new__(cls)
                    effect.name = name
                    effect.id = len(cls._by_id)
                    effect.default = None
                    cls._by_id.append(effect)
                    cls._by_name[name] = effect
        return effect

    @classmethod
    def lookup(cls, key: Union[int, str]) -> "Effect[..., Any]":
        """The effect with this id (int) or name (str); ValidationError if none."""
        if isinstance(key, str):
            effect = cls._by_name.get(key)
        elif isinstance(key, int) and 0 < key < len(cls._by_id):
            effect = cls._by_id[key]
        else:
            effect = None
        if effect is None:
            raise ValidationError(f"no effect with id or name {key!r}")
        return effect

    if TYPE_CHECKING:
        default: Optional[Callable[P, R]]
        name: str
        id: int

        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...
    else:
        def __call__(self, *args):
            """``eff(*args)`` is ``perform(eff, *args)``."""
            return perform(self, *args)

    def on(self, clause: Callable[Concatenate["Continuation[R, Any]", P], Any]
           ) -> Tuple["Effect[P, R]", Callable[..., Any]]:
        """``(self, clause)``, for ``Handler(on=[...])``: with it a type checker
        matches the control clause ``clause(k, *args)`` against this effect."""
        return (self, clause)

    def fun(self, clause: Callable[P, Union[R, "_Forward"]]) -> Tuple["Effect[P, R]", Callable[..., Any]]:
        """``(self, clause)``, for ``Handler(fun=[...])``: with it a type checker
        matches the tail-resumptive clause ``clause(*args) -> R`` against this effect."""
        return (self, clause)

    def __repr__(self):
        return f"Effect({self.name!r})"

    def __reduce__(self):
        return (Effect, (self.name,))


# --- handlers ---------------------------------------------------------------


class _Forward:
    """The type of :data:`FORWARD`."""

    __slots__ = ()

    def __repr__(self):
        return "FORWARD"

    def __reduce__(self):
        return "FORWARD"


#: Returned by a ``fun`` clause to decline the effect: the search goes on with
#: the handlers outside (OCaml's ``effc`` returning ``None``, decided per call).
FORWARD = _Forward()


#: What ``Handler(on=...)`` and ``Handler(fun=...)`` take: a mapping from effects
#: to clauses, or pairs ``(effect, clause)`` (``Effect.on`` / ``Effect.fun`` make
#: pairs that type checkers check).
Clauses = Union[Mapping["Effect[Any, Any]", Callable[..., Any]],
                Iterable[Tuple["Effect[Any, Any]", Callable[..., Any]]]]

_CALLED_AS = {"on": "clause(k, *args): the continuation, then the arguments of perform",
              "fun": "clause(*args): the arguments of perform"}


def _check_clauses(clauses, what):
    if clauses is None:
        return {}
    try:
        clauses = dict(clauses)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must map each Effect to its clause, as in "
                        f"Handler({what}={{effect: clause}}) or "
                        f"Handler({what}=[effect.{what}(clause)]), not {clauses!r}") from None
    for effect, clause in clauses.items():
        if not isinstance(effect, Effect):
            raise TypeError(f"{what} keys must be Effect instances, not {effect!r}")
        if not callable(clause):
            raise TypeError(f"{what} clause for {effect!r} is not callable")
    return clauses


_ARITY_MESSAGE = re.compile(r"^([\w.<>]+)\(\) (?:takes|missing|got)")


def _explain_clause_error(handler, exc):
    """When ``exc`` is Python's TypeError for calling one of ``handler``'s
    clauses with the wrong arguments, add which effect's clause it was and how
    clauses are called.  Runs only on the way out of a failed handler, so the
    hot path pays nothing (no signature is inspected when a handler is built:
    handlers are built in hot loops)."""
    message = str(exc)
    match = _ARITY_MESSAGE.match(message)
    if match is None or "clause for" in message:
        return
    codes = set()
    tb = exc.__traceback__
    while tb is not None:   # a frame of the clause itself: the error is inside it
        codes.add(tb.tb_frame.f_code)
        tb = tb.tb_next
    culprits = [(what, effect) for what, clauses in (("on", handler.on), ("fun", handler.fun))
                for effect, clause in clauses.items()
                if getattr(clause, "__qualname__", None) == match.group(1)
                and getattr(getattr(clause, "__func__", clause), "__code__", None) not in codes]
    if len(culprits) == 1:
        what, effect = culprits[0]
        article = "an" if what == "on" else "a"
        exc.args = (f"{message} (the {what!r} clause for {effect!r} of {handler!r}; "
                    f"{article} {what!r} clause is called as {_CALLED_AS[what]})",)


class Handler(data_type("HandlerData", ("on", "fun", "ret", "exc"))):
    """A handler: control clauses (``on``), tail-resumptive clauses (``fun``),
    a return clause (``ret``) and an exception clause (``exc``).

    * ``on[effect](k, *args)``: ``k`` is a one-shot :class:`Continuation`;
      the clause's result is the result of the handled computation.
    * ``fun[effect](*args)``: runs in place; its result resumes the performer.
      An exception it raises is raised at the perform site.
    * ``ret(value)``: applied to the body's return value (default: identity).
    * ``exc(exception)``: applied to an ``Exception`` escaping the body
      (default: re-raise).  It does not see exceptions of the clauses, nor
      ``BaseException``-only ones (``KeyboardInterrupt``, ``GreenletExit``).
    """

    __slots__ = ()

    def __init__(self, on: Optional[Clauses] = None, fun: Optional[Clauses] = None,
                 ret: Optional[Callable[[Any], Any]] = None,
                 exc: Optional[Callable[[Exception], Any]] = None) -> None:
        self.on = _check_clauses(on, "on")
        self.fun = _check_clauses(fun, "fun")
        both = self.on.keys() & self.fun.keys()
        if both:
            raise ValidationError(f"effects with both an 'on' and a 'fun' clause: {both}")
        if ret is not None and not callable(ret):
            raise TypeError("ret must be callable")
        if exc is not None and not callable(exc):
            raise TypeError("exc must be callable")
        self.ret = ret
        self.exc = exc

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` under this handler (deep; OCaml ``match_with``)."""
        try:
            if not self.on and not stack_is_deep():
                return self._run_in_place(fn, args)
            chain = Chain(*(2 * (fibers.new_fiber(fn, args, self),)))
            return _drive([chain, (False, None)])
        except TypeError as exc:
            _explain_clause_error(self, exc)
            raise

    def _run_in_place(self, fn, args):
        # Without control clauses nothing can suspend to this handler, so the
        # body needs no fiber of its own: push the handler, call, pop.  (Deep
        # in a Python stack, run() uses a fiber anyway: a fresh stack keeps
        # nested handlers from ending in RecursionError.)
        stack = local.state.current.stack
        stack.append(self)
        try:
            value = fn(*args)
        except Exception as exc:
            _pop(self)
            if self.exc is None:
                raise
            return self.exc(exc)
        except BaseException:
            _pop(self)
            raise
        _pop(self)
        return value if self.ret is None else self.ret(value)

    def __enter__(self):
        push_handler(self)
        return self

    def __exit__(self, exc_type, exc, traceback):
        pop_handler(self)
        if isinstance(exc, TypeError):
            _explain_clause_error(self, exc)
        return False

    def __repr__(self):
        names = [e.name for e in self.on] + [e.name + "(fun)" for e in self.fun]
        return f"<Handler {', '.join(names) or 'empty'}>"


def push_handler(handler: Handler) -> None:
    """Push ``handler`` (``fun`` clauses only) on the running fiber's handler stack."""
    if handler.on or handler.ret is not None or handler.exc is not None:
        raise ValidationError(
            "only a handler with just 'fun' clauses can be installed in place; "
            "use handler.run(fn) for 'on', 'ret' and 'exc'")
    local.state.current.stack.append(handler)


def pop_handler(handler: Handler) -> None:
    """Pop ``handler``, which must be the innermost entry of the running fiber's stack."""
    _pop(handler)


def _pop(entry):
    fiber = local.state.current
    stack = fiber.stack
    if stack and stack[-1] is entry:
        stack.pop()
    elif fiber.unwinder is None:   # a fiber being unwound may have lost its stack
        raise ValidationError(f"{entry!r} is not the innermost handler of this fiber")


class _Skip(data_type("SkipData", ("fiber", "index"))):
    """Pushed while a ``fun`` clause runs: the search resumes below the handler
    that owns the clause (entry ``index`` of ``fiber``; -1 is its control handler)."""

    __slots__ = ()

    def __init__(self, fiber, index):
        self.fiber = fiber
        self.index = index


def _perform_py(effect, /, *args, **keywords):
    """Perform ``effect`` with ``args``; return the value the handler resumes with.

    Raises :class:`Unhandled` here, at the perform site, when no handler in
    scope handles ``effect`` and it has no ``default``.

    This is the reference implementation; ``perform`` is the compiled copy in
    kina_fx/_speedups_c/perform.c when that is in use.
    """
    if keywords:
        raise keyword_arguments_error(effect, tuple(keywords))
    st = local.state
    f = st.current
    i = len(f.stack) - 1
    entry = h = None
    while True:
        # Search: entry i of fiber f's stack (i == -1: f's control handler),
        # innermost first, then on to f's parent.
        if i >= 0:
            entry = f.stack[i]
            if entry.__class__ is _Skip:
                f = entry.fiber
                i = entry.index - 1
                if i >= -1:
                    continue
            else:
                clause = entry.fun.get(effect)
                if clause is None:
                    i -= 1
                    continue
                answer = _run_fun_clause(st, f, i, clause, args)
                if answer is not FORWARD:
                    return answer
                i -= 1
                continue
        else:
            h = f.handler
            if h is not None:
                clause = h.fun.get(effect)
                if clause is not None:
                    answer = _run_fun_clause(st, f, -1, clause, args)
                    if answer is not FORWARD:
                        return answer
                elif effect in h.on:
                    found = [f, h]
                    del f, h, st, entry
                    return _suspend_perform(effect, args, found)
        f = f.parent
        if f is None:
            if not isinstance(effect, Effect):
                raise TypeError(f"perform needs an Effect, not {effect!r}")
            if effect.default is not None:
                return effect.default(*args)
            raise Unhandled(effect, args)
        i = len(f.stack) - 1


def keyword_arguments_error(effect, names) -> TypeError:
    """The error of ``perform(effect, key=...)`` (both implementations): it
    names the effect, as the call's own TypeError could not."""
    plural = "s" if len(names) > 1 else ""
    return TypeError(f"perform({effect!r}, ...) got keyword argument{plural} {', '.join(names)}: "
                     "an effect's arguments are positional, as in perform(effect, *args)")


def _run_fun_clause(st, f, i, clause, args):
    # A tail-resumptive clause runs here, on the performer's stack, outside its
    # own handler: the skip marker sends the clause's own performs below it.
    marker = _Skip(f, i)
    st.current.stack.append(marker)
    del f
    try:
        return clause(*args)
    finally:
        _remove_marker(st.current.stack, marker)


def _remove_marker(stack, marker):
    # Normally the marker is on top again; a clause that pushed a handler and
    # left it there (a C handler may) keeps that handler, above the marker.
    if not stack or stack[-1] is marker:
        stack.pop()                 # IndexError if the clause emptied the stack
        return
    for j in range(len(stack) - 2, -1, -1):
        if stack[j] is marker:
            del stack[j]
            return


if TYPE_CHECKING:
    def perform(effect: Effect[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Perform ``effect`` with ``args``; return the value the handler resumes with."""
        ...
else:
    perform = _perform_py if _speedups is None else _speedups.perform


def _suspend_perform(effect, args, found):
    """The ``on`` branch of perform: suspend the chain from the running fiber up
    to ``found[0]`` (the fiber whose control handler ``found[1]`` has an ``on``
    clause for ``effect``) and hand it to that fiber's resumer; return or raise
    what the continuation is resumed with.

    Nothing a suspended frame keeps may refer to the fibers (see fibers.py),
    hence post-then-del-then-suspend; ``found`` is emptied so that the caller's
    frame (Python or C) keeps nothing either.
    """
    f, h = found
    found.clear()
    if f.parent is None:
        # No resumer: the chain is being unwound (a dropped continuation's
        # cleanup), detached from everything outside it.  Nothing can answer.
        if effect.default is not None:
            return effect.default(*args)
        raise Unhandled(effect, args)
    st = local.state
    k = Continuation(st.current, f, f.shallow)
    if f.shallow:
        f.handler = None
    fibers.post(f, (PERFORMED, h, (effect, args, k)))
    del f, k, h, st
    send = fibers.suspend()
    if send[0]:
        exc = send[1]
        send = None
        try:
            raise exc
        finally:
            # A frame holding the exception it raises is a cycle (exception ->
            # traceback -> frame) that keeps the frame and its callers alive
            # until the cycle collector runs, and what they reference: a
            # clause's continuation would look kept, and not be aborted.
            exc = None
    return send[1]


# --- continuations ----------------------------------------------------------


class _ContinuationReference:
    """The reference versions of the methods of :class:`Continuation` that the
    C core compiles, ``resume`` and ``__del__``.  Continuation lists this class
    after its data type: with kina_fx._speedups in use, the compiled ``resume``
    (which ContinuationData gives each class deriving from it) and finalizer
    (kina_fx/_speedups_c/round_trip.c) come first in its MRO; with the
    pure-Python reference, these are the ones."""

    __slots__ = ()

    def resume(self, value=None):
        """OCaml ``continue k value``: returns what the handler returns."""
        top = self.top
        if top is None or self.shallow or top.thread != local.state.serial:
            self._check(shallow=False)            # raises the matching error
        return _resume_from(sys._getframe(1), self, (False, value))

    def __del__(self):
        # Dropped without being used: run its cleanup (not at interpreter exit,
        # when greenlets can no longer be switched to).
        if getattr(self, "top", None) is not None and not sys.is_finalizing():
            fibers.unwind(self)


class Continuation(Chain, data_type("ContinuationData", ("shallow",), base=Chain.__base__),
                   _ContinuationReference, Generic[R, T]):
    """A one-shot continuation: the suspended fibers from a perform up to its handler.

    Deep continuations (from ``Handler.run``) take ``resume``/``discontinue``;
    shallow ones (from :func:`fiber` or a shallow handler) take
    ``resume_with``/``discontinue_with``.  A second use raises
    :class:`ContinuationAlreadyResumed` and changes nothing.  A continuation
    dropped without being used is unwound when it is collected: ``finally``
    blocks and ``with`` exits of the suspended code run.
    """

    __slots__ = ()

    def __init__(self, top, base, shallow=False):
        self.top = top
        self.base = base
        self.shallow = shallow

    if TYPE_CHECKING:
        def resume(self, value: R = None) -> T:  # type: ignore[assignment]
            """OCaml ``continue k value``: returns what the handler returns."""
            ...

    def discontinue(self, exc: Union[BaseException, type]) -> T:
        """OCaml ``discontinue k exc``: raise ``exc`` at the perform site."""
        self._check(shallow=False)
        # Passed on without a reference here (see _resume_from).
        send = [(True, _as_exception(exc))]
        exc = None
        return _resume_from(sys._getframe(1), self, send)

    def resume_with(self, value: R, handler: Handler) -> Any:
        """OCaml ``Effect.Shallow.continue_with k value handler``."""
        self._check(shallow=True)
        self._install(handler)
        return _resume_from(sys._getframe(1), self, (False, value))

    def discontinue_with(self, exc: Union[BaseException, type], handler: Handler) -> Any:
        """OCaml ``Effect.Shallow.discontinue_with k exc handler``."""
        self._check(shallow=True)
        self._install(handler)
        send = [(True, _as_exception(exc))]
        exc = None
        return _resume_from(sys._getframe(1), self, send)

    def __reduce__(self):
        raise TypeError("a continuation cannot be pickled: it is a suspended stack, used once")

    def __copy__(self):
        raise TypeError("a continuation cannot be copied: it is one-shot")

    def __deepcopy__(self, memo):
        raise TypeError("a continuation cannot be copied: it is one-shot")

    @property
    def resumed(self) -> bool:
        """True once the continuation has been used."""
        return self.top is None

    def _check(self, shallow):
        if self.top is None:
            raise ContinuationAlreadyResumed("this continuation was already resumed or discontinued")
        fibers.check_owner(self.top)
        if self.shallow != shallow:
            use = "resume_with/discontinue_with" if self.shallow else "resume/discontinue"
            raise TypeError(f"a {'shallow' if self.shallow else 'deep'} continuation takes {use}")

    def _install(self, handler):
        if not isinstance(handler, Handler):
            raise TypeError(f"resume_with needs a Handler, not {handler!r}")
        self.base.handler = handler
        self.base.shallow = True

    def __repr__(self):
        kind = "shallow" if self.shallow else "deep"
        return f"<Continuation {kind} {'used' if self.top is None else 'ready'}>"


def fiber(fn: Callable[[Any], Any]) -> "Continuation[Any, Any]":
    """A shallow continuation that, resumed with ``v``, runs ``fn(v)`` (OCaml ``Effect.Shallow.fiber``)."""
    if not callable(fn):
        raise TypeError("fiber() needs a callable")
    f = fibers.new_fiber(fn, None, None, shallow=True)
    return Continuation(f, f, shallow=True)


def _as_exception(exc):
    if isinstance(exc, type) and issubclass(exc, BaseException):
        exc = exc()
    if not isinstance(exc, BaseException):
        raise TypeError(f"discontinue needs an exception, not {exc!r}")
    return exc


# --- fibers driven step by step ------------------------------------------------

# Performed by a handler that wants the effect to suspend the fiber to whoever
# drives it (a C handler returning KINA_SUSPEND): every Stepper catches it and
# reports the original effect and arguments.  Private: not interned, id 0, so
# no user (and no C host, through kina_effect_id) can perform it.
_SUSPEND_TO_HOST = object.__new__(Effect)
_SUSPEND_TO_HOST.name, _SUSPEND_TO_HOST.id, _SUSPEND_TO_HOST.default = "kina.suspend_to_host", 0, None

# Steppers whose fiber kept performing after 100 cancellations: their C frames
# never return, so they can be neither resumed nor unwound.  Kept here, never
# collected (collecting them would unwind them, which such code never ends).
_abandoned = []


def suspend_to_host(effect, *args):
    """From inside a handler clause: suspend the nearest :class:`Stepper` fiber
    outside that handler as if it had caught ``effect`` itself; return the value
    its owner resumes it with.  :class:`Unhandled` (naming ``effect``, not the
    private effect used for it) when no Stepper is outside."""
    try:
        return perform(_SUSPEND_TO_HOST, effect, args)
    except Unhandled as exc:
        if exc.effect is not _SUSPEND_TO_HOST:
            raise
    raise Unhandled(effect, args, f"no fiber to suspend for {effect.name}: its handler asked to "
                                  "suspend (KINA_SUSPEND) but no kina_fiber_create fiber "
                                  "(Stepper) is outside the handler")


class _Catch(data_type("CatchData", ("effects",))):
    """The ``on`` table of a Stepper's handler: which effects suspend the fiber."""

    __slots__ = ()

    def __init__(self, effects):
        self.effects = None if effects is None else frozenset(effects)

    def __contains__(self, effect):
        return (self.effects is None or effect in self.effects
                or effect is _SUSPEND_TO_HOST)

    def __iter__(self):              # what Handler.__repr__ lists
        return iter(self.effects or ())


class Stepper(data_type("StepperData", ("_handler", "_chain", "state", "effect", "args", "result",
                                        "error", "thread"))):
    """A fiber its owner drives one step at a time, like a generator.

    ``Stepper(fn, *args, catch=None)`` runs ``fn(*args)`` on a new fiber whose
    control handler suspends it on every effect in ``catch`` (None: every
    effect that reaches it unhandled).  Other effects are forwarded to the
    handlers around the call to :meth:`step`.  This is what the C ABI's host
    fibers are (``kina_fiber_create`` / ``kina_resume_fiber``).

    ``step(value)`` starts the fiber or resumes its pending perform with
    ``value`` and returns the new :attr:`state`: ``"suspended"`` (see
    :attr:`effect`, :attr:`args`), ``"done"`` (:attr:`result`), ``"failed"``
    (:attr:`error`) or ``"cancelled"``.  ``cancel()`` raises
    :class:`~kina_fx.errors.Cancelled` at the pending perform and runs the
    fiber's cleanup.
    """

    NEW, RUNNING, SUSPENDED = "new", "running", "suspended"
    DONE, FAILED, CANCELLED = "done", "failed", "cancelled"

    def __init__(self, fn, *args, catch=None):
        if not callable(fn):
            raise TypeError("Stepper needs a callable")
        self._handler = Handler()
        self._handler.on = _Catch(catch)
        first = fibers.new_fiber(fn, args, self._handler)
        self._chain = Chain(first, first)
        self.state = self.NEW
        self.effect = None
        self.args = ()
        self.result = None
        self.error = None
        self.thread = first.thread

    def step(self, value=None) -> str:
        """Start the fiber, or resume its pending perform with ``value``."""
        return self._step((False, value))

    def throw(self, exc) -> str:
        """Resume the pending perform by raising ``exc`` there."""
        return self._step((True, _as_exception(exc)))

    def cancel(self) -> str:
        """Cancel: ``Cancelled`` at the pending perform (again at each later
        perform, up to 100 times); a fiber still performing after that is
        abandoned (never resumed, never unwound, its memory kept)."""
        if self.state == self.NEW:
            self._chain = None
            self.state = self.CANCELLED
            return self.state
        for _ in range(100):
            if self.state != self.SUSPENDED:
                break
            self._step((True, Cancelled("the fiber was cancelled")), cancelling=True)
        if self.state == self.SUSPENDED:       # it ignores cancellation: abandon it
            _abandoned.append(self._chain)
            self._chain = None
        if self.state != self.FAILED or isinstance(self.error, Cancelled):
            self.state = self.CANCELLED
        return self.state

    def _step(self, send, cancelling=False) -> str:
        if self.state == self.RUNNING:
            raise ValidationError("the fiber is running (a fiber cannot resume itself)")
        if self.state not in (self.NEW, self.SUSPENDED):
            raise ValidationError(f"the fiber is {self.state}; only a new or suspended fiber can be resumed")
        fibers.check_owner(self._chain.top)
        chain, self._chain = self._chain, None
        self.state = self.RUNNING
        self.effect, self.args = None, ()
        try:
            kind, _, payload = _switch_into(chain, send)
        except BaseException as exc:
            self.state, self.error = self.FAILED, exc
            raise
        if kind is PERFORMED:
            effect, args, self._chain = payload
            if effect is _SUSPEND_TO_HOST:
                effect, args = args
            self.effect, self.args = effect, args
            self.state = self.SUSPENDED
        elif kind is RETURNED:
            self.result = payload
            self.state = self.CANCELLED if cancelling else self.DONE
        else:
            self.error = payload
            self.state = self.CANCELLED if isinstance(payload, Cancelled) else self.FAILED
        return self.state

    def __repr__(self):
        return f"<Stepper {self.state}>"


# --- the driver loop --------------------------------------------------------

# fibers.switch_into, or its compiled copy (_speedups_c/round_trip.c's rt_switch_into).
_switch_into = fibers.switch_into if _speedups is None else _speedups.switch_into


class _TailResume(data_type("TailResumeData", ("chain", "send"))):
    """Handed back by a resume in tail position to the driver that called the clause."""

    __slots__ = ()

    def __init__(self, chain, send):
        self.chain = chain
        self.send = send


def _drive_py(step):
    """Resume the chain of ``step``, a list ``[chain, send]`` that it empties,
    and run the clauses of whichever handlers it stops at.

    Returns the handler's result: the return clause's, the exception clause's,
    or a control clause's.  A clause that resumes a continuation in tail
    position hands it back here instead of nesting (see _resume_from).
    """
    # Each step's chain and send go to the switch with no reference left here
    # or in the caller (as in the compiled loop): a send may hold an exception
    # that a discontinue raises in the body, which holds the frames it goes
    # through, and what they reference (see _resume_from).
    while True:
        kind, handler, payload = fibers.switch_into_step(step)     # (the reference's loop only)
        if kind is PERFORMED:
            effect, args, k = payload
            del payload
            try:
                result = handler.on[effect](k, *args)
            except BaseException as exc:
                if k.top is not None:       # raised without using k: abort it?
                    box = [k]
                    del k
                    _abort_unless_kept(box, handler, exc)
                raise
            if k.top is not None:           # returned without using k: abort it?
                box = [k]
                del k
                result = _abort_unless_kept(box, handler, None, result)
        elif kind is RETURNED:
            result = payload if handler.ret is None else handler.ret(payload)
        elif kind is RAISED:
            # The exception is raised or handed to the exc clause, and no
            # longer held here once that is done, returning or raising: this
            # frame outlives its run when the exception's traceback or a later
            # frame's f_back chain holds it, and with its locals the
            # exception, its frames and what they reference (a cycle; a
            # clause's continuation would look kept; see _suspend_perform).
            try:
                if handler.exc is None or not isinstance(payload, Exception):
                    raise payload
                result = handler.exc(payload)
            finally:
                payload = None
        if result.__class__ is _TailResume:
            step = [result.chain, result.send]
            result = None
            continue
        return result


def _abort_unless_kept(box, handler, exc, result=None):
    """Eager abort: called by the driver loop (this module's and speedups.c's)
    when ``handler``'s clause returned ``result``, or raised ``exc``, without
    resuming or discontinuing its continuation ``k``, the only item of ``box``
    (the driver's own reference is already gone).  Returns the clause's result.

    A ``k`` that is still referenced from anywhere else (a scheduler's queue, a
    closure, a variable of the caller) is kept: nothing happens.  Otherwise
    the body is aborted now, before the handler's result or exception reaches
    the caller: :class:`~kina_fx.fibers.Unwind` is raised at the perform, with
    the chain resumed under this very driver, so its ``finally`` blocks and
    ``with`` exits run and the effects they perform reach the same handlers as
    the rest of the body.  If that cleanup raises, its exception replaces the
    clause's result or exception (which becomes its ``__context__``), as a
    ``finally`` block's exception does in Python.  What the aborted body
    returns, if it catches the Unwind, is discarded.

    A clause that ended by resuming *another* continuation in tail position
    (``return other.resume_with(v, h)``: the resume came back here as a
    _TailResume, not yet run) has not finished: that resume runs to its end
    first, and its outcome is the clause's, then ``k`` is aborted.  (A kept
    ``k`` needs no such order: the tail resume goes on in the driver's loop,
    as a scheduler's ``return queue.popleft().resume()`` must, in constant
    stack.)
    """
    k = box.pop()
    # References: ``k`` here and getrefcount's argument; when the clause raised,
    # the frames of the traceback (the clause's own arguments) do not count,
    # nor do the copies a trace function makes on 3.10 (counted first: that
    # may add them).
    copies = copied_into_frame_locals(k)
    if sys.getrefcount(k) - dying_with_traceback(k, exc, _ABORT_SIGNALS) - copies > 2:
        return result
    if result.__class__ is _TailResume:
        step = [result.chain, result.send]
        result = None
        try:
            result = _drive(step)
        except BaseException as error:
            _abort(k, handler, error)
            raise
    _abort(k, handler, exc)
    return result


# The ids of the abort signals in flight.  Each one's traceback is dropped when
# its abort ends, so the frames it went through do not keep a continuation
# that an inner clause, unwound by it, dropped meanwhile (dying_with_traceback).
_ABORT_SIGNALS: set = set()


def _abort(k, handler, exc):
    """Abort the body suspended in ``k`` (see _abort_unless_kept)."""
    signal = fibers.Unwind("the handler returned without resuming: the body is aborted")
    _ABORT_SIGNALS.add(id(signal))
    try:
        if k.shallow:
            k.discontinue_with(signal, handler)
        else:
            k.discontinue(signal)
    except fibers.Unwind as unwound:
        if unwound is not signal:
            raise
    except BaseException as cleanup_error:
        if exc is not None and cleanup_error is not exc:
            cleanup_error.__context__ = exc
        raise
    finally:
        # Drop the signal's traceback, whose frames (this one, the driver's)
        # hold the signal.  Left to the cycle collector, that cycle would keep
        # every caller's frame alive, and what they reference: the
        # continuation of an outer clause, then not aborted when it returns.
        signal.__traceback__ = None
        _ABORT_SIGNALS.discard(id(signal))


# The driver loop in use: the one above, or its compiled copy
# (_speedups_c/round_trip.c's rt_drive).
_drive = _drive_py if _speedups is None else _speedups.drive


def discontinue_taking(k: Continuation, box: list) -> Any:
    """``k.discontinue(box.pop())``, for a caller holding the exception only in
    ``box``: nothing of the caller's keeps it while the body runs (on Python
    3.10 a call's arguments stay on the caller's value stack until it
    returns; the exception's traceback holds the frames it goes through)."""
    k._check(shallow=False)
    send = [(True, _as_exception(box.pop()))]
    return _resume_from(sys._getframe(1), k, send)


def _resume_from(caller, k, send):
    # ``send``: the (is_exception, value) pair, or (discontinue) a one-item
    # list holding it, emptied here: on Python 3.10 a caller's value stack
    # keeps a call's arguments until it returns, so a pair passed directly
    # would stay referenced by discontinue's frame while the body runs.
    if send.__class__ is list:
        send = send.pop()
    chain = Chain(k.top, k.base)
    k.top = k.base = None
    if _returns_straight_to_driver(caller):
        return _TailResume(chain, send)
    del caller
    # The driver gets chain and send in a list that it empties, with no
    # reference left here: a send may hold an exception thrown into the body,
    # whose traceback holds the frames it goes through, and what they
    # reference (a clause's continuation would look kept, and not be aborted,
    # while the resumed code runs).
    step = [chain, send]
    del chain, send
    if stack_is_deep():
        return _drive_on_fresh_stack(step)
    return _drive(step)


# A resume that is not in tail position nests: the clause waits on the
# resumer's stack for the handler's result.  Past _HOP_DEPTH Python frames the
# nested driver runs on a fresh helper fiber (started by the trampoline, so
# with a shallow Python stack of its own) instead: deep chains of non-tail
# resumes then cost heap memory, as in OCaml, rather than a RecursionError.
_HOP_DEPTH = 300


def _stack_is_deep_py() -> bool:
    try:
        sys._getframe(_HOP_DEPTH)
    except ValueError:
        return False
    return True


# The compiled check counts the C driver loops running on this fiber too, one
# frame each, as this one counts _drive_py's frames.
stack_is_deep = _stack_is_deep_py if _speedups is None else _speedups.stack_is_deep


def on_fresh_stack(fn, *args):
    """``fn(*args)`` on a fresh helper fiber, with a shallow Python stack of
    its own: returns its result, or raises its exception.  Where a nested
    run goes once stack_is_deep(): here, and kina_fx.multishot's replays."""
    helper = fibers.new_fiber(fn, args)
    del args
    kind, _, payload = _switch_into(Chain(helper, helper), (False, None))
    if kind is RAISED:
        try:
            raise payload
        finally:
            payload = None                  # no cycle through this frame (see _suspend_perform)
    return payload


def _drive_on_fresh_stack(step):
    # ``step`` ([chain, send]) goes on to the driver, which empties it.
    return on_fresh_stack(_drive, step)


# Tail-resume detection lives in kina_fx/tailcalls.py; the driver loop is the
# frame a tail resume must reach.
def _returns_straight_to_driver_py(frame) -> bool:
    """True when ``frame``, the caller of a resume, returns the resume's result
    unchanged to a driver loop (see :mod:`kina_fx.tailcalls`)."""
    return tailcalls.returns_straight_to(frame, _runs_drive_py)


def _runs_drive_py(frame) -> bool:
    return frame.f_code is _DRIVE_CODE


_DRIVE_CODE = _drive_py.__code__

# The compiled check (_speedups_c/tail.c) stops at the frames its own driver
# loop was called from instead, since that loop has no frame of its own.
_returns_straight_to_driver = (_returns_straight_to_driver_py if _speedups is None
                               else _speedups.returns_straight_to_driver)
