"""Multi-shot continuations by replay.

``MultiHandler`` is a deep handler whose continuations can be resumed any
number of times: backtracking search, non-determinism (``amb``), enumeration
of probability distributions.  kina_fx's fibers are one-shot (a suspended
greenlet can be resumed once), so the later shots are made by *replay*, the
technique of Koppel, Scherer and Solar-Lezama, "Capturing the future by
replaying the past" (ICFP 2018):

* every answer the handled computation receives for an effect that reaches the
  handler is recorded, in order;
* the first use of a continuation resumes the live, suspended computation
  (exactly what a one-shot handler does, at the same cost);
* every later use runs the handled function again from its start, answering
  its first performs from the record of that continuation, and the new answer
  at the perform the continuation was captured at; from there it runs live.

Why replay rather than copying interpreter frames: a replayed run is an
ordinary run, so it is correct whatever is on the stack, C frames included
(``sorted(key=...)``, ``list(map(...))``, a C extension calling back), and
nothing on the heap that the computation creates is shared between shots (an
iterator made inside the body is made anew for each).

The price, and the rules (docs/effects.md, "Multi-shot continuations"):

* The handled function must be deterministic given the answers to its
  effects.  Side effects that do not go through effects (``print``, appending
  to a list defined outside) are repeated by every replay.  What can be
  checked is: a replayed run that performs a different effect, with arguments
  of a different value or type, or that ends before reaching the point being
  replayed, raises :class:`ReplayDiverged`.
* Effects that the handler does not handle but that reach it (they are handled
  further out, or have a ``default``) are forwarded outward once, and their
  answers recorded like the others: replays do not perform them again, so an
  outer state handler sees each ``put`` once, as with a real multi-shot
  continuation.  Effects handled by handlers the body installs itself are
  re-run by replays (they are part of the deterministic body).
* A replay costs a re-run of the prefix: a shot captured after ``n`` performs
  costs ``n`` recorded answers (each a fiber round trip, about a microsecond)
  plus the body's own work up to there.
* ``fn`` and ``args`` are called again as they are: a body must not depend on
  mutating its arguments.

Handlers that do not opt in (plain :class:`~kina_fx.handlers.Handler`) keep
one-shot continuations and :class:`~kina_fx.errors.ContinuationAlreadyResumed`;
nothing here touches their speed.
"""
from __future__ import annotations

import copy

from . import fibers
from .errors import ValidationError
from .handlers import (FORWARD, Effect, Handler, discontinue_taking, on_fresh_stack, perform,
                       stack_is_deep)

__all__ = ["MultiHandler", "MultiContinuation", "ReplayDiverged", "under_multihandler",
           "perform_in_every_run"]


class ReplayDiverged(ValidationError):
    """A replayed run did not retrace the run it replays: the handled function
    is not deterministic given the answers to its effects."""


class MultiHandler:
    """A deep handler whose ``on`` clauses receive multi-shot continuations.

    ``MultiHandler(on=None, fun=None, ret=None, exc=None)`` takes the clauses
    of :class:`~kina_fx.handlers.Handler`, with the same meaning, except that
    the ``k`` an ``on`` clause receives is a :class:`MultiContinuation`, which
    ``resume`` and ``discontinue`` accept any number of times.  ``fun``
    clauses run once per perform (their answers are recorded and replayed).
    ``run(fn, *args)`` runs ``fn(*args)`` under it and returns the handler's
    result, like ``Handler.run``.
    """

    __slots__ = ("on", "fun", "ret", "exc")

    def __init__(self, on=None, fun=None, ret=None, exc=None):
        checked = Handler(on=on, fun=fun, ret=ret, exc=exc)   # the same validation
        self.on, self.fun, self.ret, self.exc = checked.on, checked.fun, checked.ret, checked.exc

    def run(self, fn, *args):
        """Run ``fn(*args)`` under this handler; return the handler's result."""
        if not callable(fn):
            raise TypeError("MultiHandler.run needs a callable")
        return _Run(self, fn, args, ()).start()

    def handles(self):
        """The effects this handler has a clause for."""
        return frozenset(self.on) | frozenset(self.fun)

    def __repr__(self):
        names = [e.name for e in self.on] + [e.name + "(fun)" for e in self.fun]
        return f"<MultiHandler {', '.join(names) or 'empty'}>"


class MultiContinuation:
    """The rest of a handled run from one perform on; resumable any number of times.

    The first ``resume``/``discontinue`` continues the suspended run itself;
    each later one replays the run from its start (see the module docstring).
    Each returns what the handler returns for that branch.
    """

    __slots__ = ("_run", "_entry_at", "_effect", "_args", "_live", "shots")

    def __init__(self, run, effect, args, live):
        self._run = run
        self._entry_at = run.log            # the record up to this perform
        self._effect = effect
        self._args = args
        self._live = live
        self.shots = 0                     # how many times it was resumed or discontinued

    def resume(self, value=None):
        """Continue the run with ``value`` as the perform's result."""
        return self._shot((False, value))

    def discontinue(self, exc):
        """Continue the run by raising ``exc`` at the perform."""
        if isinstance(exc, type) and issubclass(exc, BaseException):
            exc = exc()
        if not isinstance(exc, BaseException):
            raise TypeError(f"discontinue needs an exception, not {exc!r}")
        # Passed on with no reference left here, nor in _shot or a replay's
        # script once used: while the run goes on, the exception's traceback
        # holds the frames it goes through, and a continuation they reference
        # would look kept (docs/effects.md, "Kept is kept").
        # (In one-item lists, emptied by the callee: on Python 3.10 a caller's
        # value stack keeps a call's arguments until it returns.)
        send = [(True, exc)]
        exc = None
        return self._shot(send)

    def _shot(self, send):
        if send.__class__ is list:
            send = send.pop()
        self.shots += 1
        live = self._live
        if live is not None:
            self._live = None
            if send[0]:
                box = [send[1]]
                send = None
                return discontinue_taking(live, box)
            return live.resume(send[1])
        script = _unroll(self._entry_at)
        script.append((self._effect, self._args, send))
        send = None
        replay = _Run(self._run.owner, self._run.fn, self._run.args, script)
        script = None
        return replay.start()

    def __reduce__(self):
        raise TypeError("a continuation cannot be pickled")

    def __repr__(self):
        return f"<MultiContinuation at {self._effect.name} after {self.shots} shots>"


def _unroll(node):
    """The record (a linked list of (previous, entry) pairs) as a list, oldest first."""
    entries = []
    while node is not None:
        node, entry = node
        entries.append(entry)
    entries.reverse()
    return entries


class _Table:
    """The ``on`` table of a run's one-shot handler: every effect that reaches
    it is answered by the run (from its record, by a clause, or outward)."""

    __slots__ = ("run", "clauses")

    def __init__(self, run):
        self.run = run
        self.clauses = {}

    def __contains__(self, effect):
        return True

    def __getitem__(self, effect):
        clause = self.clauses.get(effect)
        if clause is None:
            run = self.run
            clause = self.clauses[effect] = lambda k, *args: run.answer(effect, k, args)
        return clause

    def __iter__(self):              # what Handler.__repr__ lists
        return iter(self.run.owner.on)


class _Recorded:
    """The ``fun`` table of a run's in-place handler, under everything the body
    installs: every effect is answered from the record while it lasts, then by
    the run's own handler, and each answer is recorded."""

    __slots__ = ("run", "clauses")

    def __init__(self, run):
        self.run = run
        self.clauses = {}

    def get(self, effect, default=None):
        clause = self.clauses.get(effect)
        if clause is None:
            if effect in _PERFORMED_BY_EVERY_RUN:
                return default          # not recorded: the run's handler forwards it
            run = self.run
            clause = self.clauses[effect] = lambda *args: run.recorded(effect, args)
        return clause


# Effects that every run performs itself, replays included (see perform_in_every_run).
_PERFORMED_BY_EVERY_RUN = set()


def perform_in_every_run(effect: Effect) -> None:
    """Have ``effect`` performed by every run of a MultiHandler's body, replays
    included, instead of answered from the record: for effects whose
    arguments are objects the run itself makes, such as the futures that
    code under :func:`kina_fx.aio.run` waits on (a replay makes new ones, and
    must wait on those).  Such an effect is still forwarded outward by the
    MultiHandler, each time."""
    if not isinstance(effect, Effect):
        raise TypeError(f"perform_in_every_run needs an Effect, not {effect!r}")
    _PERFORMED_BY_EVERY_RUN.add(effect)


class _Run:
    """One run of the handled function: the first, or a replay of a prefix."""

    __slots__ = ("owner", "fn", "args", "script", "pos", "log", "__weakref__")

    def __init__(self, owner, fn, args, script):
        self.owner = owner
        self.fn = fn
        self.args = args
        self.script = script            # entries (effect, args, send) to answer from (None once given)
        self.pos = 0                    # how many of them were answered
        self.log = None                 # this run's record so far (linked list)

    def start(self):
        handler = Handler(ret=self.returned, exc=self.raised)
        handler.on = _Table(self)
        # Past handlers' hop depth a replay starts on a fresh fiber, so that
        # deep searches (a shot inside a shot inside a shot...) cost heap,
        # not RecursionError.
        if stack_is_deep():
            return on_fresh_stack(handler.run, self.body)
        return handler.run(self.body)

    def body(self):
        # The record is kept where the answers arrive, by an in-place handler
        # under everything the body installs: whatever answers a perform (a
        # clause, an outer handler, or the eager abort's Unwind, which no
        # clause gives) is what a replay gives back.  The recorded prefix of a
        # replay is answered right there, with no fiber switch.
        answers = Handler()
        answers.fun = _Recorded(self)
        with answers:
            return self.fn(*self.args)

    def recorded(self, effect, args):
        """The in-place answer: the recorded one while there is one, then the
        run's handler's (its ``on`` table, reached past this clause)."""
        pos = self.pos
        if pos >= len(self.script):
            try:
                value = perform(effect, *args)
            except BaseException as exc:
                self.log = (self.log, (effect, args, (True, _kept(exc))))
                raise
            self.log = (self.log, (effect, args, (False, value)))
            return value
        recorded_effect, recorded_args, send = self.script[pos]
        if recorded_effect is not effect or not _same_args(recorded_args, args):
            raise ReplayDiverged(
                f"replaying perform #{pos + 1}: the run performed {effect.name}{_show(args)} "
                f"where the recorded run performed {recorded_effect.name}{_show(recorded_args)}")
        self.pos = pos + 1
        self.script[pos] = None
        if send[0]:
            # The shot's own answer (the last entry) is raised as the clause
            # gave it; recorded ones as fresh copies (see _kept).  No frame
            # keeps it: see MultiContinuation.discontinue.
            exc = send[1] if pos == len(self.script) - 1 else _kept(send[1])
            self.log = (self.log, (effect, args, (True, _kept(exc))))
            send = None
            try:
                raise exc
            finally:
                exc = None
        self.log = (self.log, (effect, args, send))
        _check_replayable(send[1])
        return send[1]

    def answer(self, effect, k, args):
        """The ``on`` clause of the run's handler, for every effect past the record."""
        owner = self.owner
        clause = owner.on.get(effect)
        if clause is not None:
            mk = MultiContinuation(self, effect, args, k)
            del k
            # Plain calls (not ``*args``) for the common arities: the tail-resume
            # check only sees through those, and ``return k.resume(v)`` in the
            # clause then runs in constant stack, as with a one-shot handler.
            n = len(args)
            if n == 1:
                return clause(mk, args[0])
            if n == 0:
                return clause(mk)
            if n == 2:
                return clause(mk, args[0], args[1])
            return clause(mk, *args)
        fun = owner.fun.get(effect)
        try:
            # Not an ``on`` effect: a fun clause of ours answers it, or it goes
            # on outward, also when the fun clause declines (FORWARD); this
            # clause runs outside the run's handler.  Any exception,
            # BaseExceptions included (a CancelledError, a KeyboardInterrupt,
            # an outer abort's Unwind), is the perform's answer, as it would be
            # without this handler in between.
            value = FORWARD if fun is None else fun(*args)
            if value is FORWARD:
                value = perform(effect, *args)
        except BaseException as exc:
            # Thrown into the body with no reference left in this frame,
            # which waits while the body runs (see discontinue).
            box = [exc]
        else:
            return k.resume(value)
        return discontinue_taking(k, box)

    def returned(self, value):
        self._check_complete("returned")
        ret = self.owner.ret
        return value if ret is None else ret(value)

    def raised(self, exc):
        try:
            if isinstance(exc, ReplayDiverged):
                raise exc
            try:
                self._check_complete(f"raised {type(exc).__name__}")
            except ReplayDiverged as diverged:
                raise diverged from exc
            handle = self.owner.exc
            if handle is None:
                raise exc
            return handle(exc)
        finally:
            exc = None              # no cycle through this frame (see handlers._suspend_perform)

    def _check_complete(self, how):
        if self.pos < len(self.script):
            raise ReplayDiverged(
                f"the replayed run {how} after {self.pos} performs; the recorded run "
                f"performed {len(self.script)} before the point being replayed")


def _kept(exc):
    """What the record keeps of an exception the body received: a copy, without
    the traceback.  The record lives as long as any continuation of the run,
    and an exception keeps every frame it went through (and their callers'),
    with what they reference: a continuation of a clause inside the body would
    then look kept, and not be aborted.  A replay raises a fresh copy.  The
    eager abort's Unwind is kept as itself (the abort swallows only its own
    signal, and drops its traceback)."""
    if isinstance(exc, fibers.Unwind):
        return exc
    try:
        kept = copy.copy(exc)
    except Exception:                 # an exception that cannot be rebuilt: as it is
        return exc
    if type(kept) is not type(exc):
        return exc
    kept.__traceback__ = None
    return kept


def _check_replayable(value, depth=0):
    """Raise unless ``value``, an answer recorded by an earlier run, may be given
    again to a replayed one.  An object says so itself through a
    ``__kina_replay__`` method (kina_fx.autograd's Tensor refuses when its trace
    has finished: the replay runs a new trace, in which it stands for
    nothing); tuples and lists are looked into."""
    check = getattr(type(value), "__kina_replay__", None)
    if check is not None:
        check(value)
    elif depth < 4 and isinstance(value, (tuple, list)):
        for item in value:
            _check_replayable(item, depth + 1)


def _same_args(a, b):
    if a is b:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is y:
            continue
        kind = type(x)
        if kind is not type(y):
            return False
        if kind in _PLAIN:
            if x != y and not (x != x and y != y):     # NaN is the same NaN again
                return False
        elif _fingerprint(x) != _fingerprint(y):
            return False
    return True


_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None), range, Effect})
_VALUES = tuple(_PLAIN)


def _fingerprint(value, depth=0):
    # What a replay must reproduce exactly: plain values by value, containers
    # element by element, anything else by type.  (Comparing arbitrary objects
    # with == would call fresh-but-equivalent objects of a replay different.)
    if isinstance(value, _VALUES):
        return value
    if isinstance(value, (tuple, list, frozenset, set)) and depth < 4:
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return (type(value), tuple(_fingerprint(v, depth + 1) for v in items))
    return type(value)


def _show(args):
    text = repr(args if len(args) != 1 else args[0])
    return f"({text[:60] + '...' if len(text) > 60 else text})"


def under_multihandler() -> bool:
    """Whether the running code is part of the body of a :class:`MultiHandler`
    run, and so may be run again by a replay.

    A handler installed inside such a body that keeps state of its own (a
    recording, a counter) can route that state through the run's record
    (perform an effect with a ``default``: it is forwarded outward once and
    replays answer it from the record), as kina_fx.testing does; outside any
    run it can do without (and without reaching handlers that catch every
    effect, such as a ``Stepper`` with ``catch=None``).
    """
    fiber = fibers.current()
    while fiber is not None:
        handler = fiber.handler
        if handler is not None and isinstance(handler.on, _Table):
            return True
        fiber = fiber.parent
    return False
