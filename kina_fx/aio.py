"""The asyncio bridge: effect handlers whose clauses are coroutines, and effects
performed from coroutines.

The pattern is the one SQLAlchemy uses to run synchronous code over async
drivers (``greenlet_spawn`` / ``await_only``): :func:`run` starts the handled
code on a fiber and drives it from a coroutine.  Whenever that code needs to
await something (an ``async def`` clause of a handler, or :func:`await_only`
called directly), its fiber suspends to :func:`run`, which awaits it on the
running event loop, where other tasks go on meanwhile, and resumes the fiber
with the result (or raises its exception there).

::

    Fetch = Effect("fetch")

    async def fetch(url):              # an async clause
        await asyncio.sleep(0.1)
        return f"<page {url}>"

    def crawl(urls):                   # plain synchronous code
        return [perform(Fetch, u) for u in urls]

    pages = await aio.run(crawl, ["a", "b"], handlers=[aio.handler(fun={Fetch: fetch})])

Rules (docs/effects.md, "asyncio"):

* :func:`handler` builds a :class:`~kina_fx.handlers.Handler` from clauses that
  may be ``async def`` functions; the others stay as they are, so one handler
  can mix both.  An async ``fun`` clause's result is the perform's value.  An
  async ``on`` clause receives an :class:`AsyncContinuation`: ``await
  k.resume(v)``.
* An async clause runs where a plain clause would, stepped on the fiber (its
  awaits go to the loop through the fiber): what it performs, and the code it
  resumes, reach the same handlers as with a plain clause, those listed before
  its handler included.
* ``run(fn, *args, handlers=[...])`` runs ``fn(*args)`` under the handlers
  (outermost first).  ``fn`` may be a plain function or a coroutine function;
  a coroutine runs on the fiber too, so it can ``perform`` effects
  synchronously and its own ``await`` s reach the event loop unchanged.
* Cancelling the task (``task.cancel()``, ``asyncio.wait_for`` timing out)
  raises ``CancelledError`` where the fiber is waiting: ``finally`` blocks and
  ``with`` exits of the handled code run, then the task ends cancelled.  An
  exception of an awaited clause is raised at the perform, like any clause's.
* Each :func:`run` has its own fiber: concurrent tasks each run under their
  own handlers and never see each other's.
"""
from __future__ import annotations

import inspect

from .errors import ValidationError
from .handlers import Effect, Handler, Stepper, perform
from .multishot import perform_in_every_run

__all__ = ["run", "handler", "await_only", "AsyncContinuation"]

# Everything awaited under run() (await_only's awaitable, an async clause, a
# coroutine body) is stepped on the fiber itself, where the code awaiting it
# runs: what it performs, and the code it resumes, see that code's handlers.
# Only its raw yields (the futures the task waits on) leave the fiber, by this
# private effect, caught by run()'s Stepper and nothing else.
_YIELD = Effect("kina.aio.yield")
# A replay of a MultiHandler's body makes new futures: it waits on them itself.
perform_in_every_run(_YIELD)
# Answered True by an in-place handler under every handler of a run():
# "this code runs on a fiber whose yields reach the event loop".
_UNDER_RUN = Effect("kina.aio.under_run")
_UNDER_RUN.default = lambda: False
_UNDER_RUN_HANDLER = Handler(fun={_UNDER_RUN: lambda: True})


def await_only(awaitable):
    """From synchronous code running under :func:`run`: await ``awaitable`` on
    the event loop and return its result (raise its exception)."""
    return _on_fiber(awaitable, "kina_fx.aio.await_only() needs a caller running under kina_fx.aio.run()")


def _on_fiber(awaitable, refusal):
    if not perform(_UNDER_RUN):
        if inspect.iscoroutine(awaitable):
            awaitable.close()        # never awaited: say so once, here, not as a warning
        raise ValidationError(refusal)
    return _drive_coroutine(_as_iterator(awaitable))


def run(fn, *args, handlers=()):
    """A coroutine: run ``fn(*args)`` under ``handlers`` (outermost first) on a
    fiber whose awaits go to the running event loop; return its result."""
    if not callable(fn):
        raise TypeError("kina_fx.aio.run needs a callable")
    handlers = tuple(handlers)
    for h in handlers:
        if not hasattr(h, "run"):
            raise TypeError(f"handlers must be Handler objects, not {h!r}")
    return _awaited(_Driver(_handled(fn, args, handlers)))


async def _awaited(driver):
    # A real coroutine around the driver: what asyncio.run and create_task take.
    return await driver


def _handled(fn, args, handlers):
    def body():
        result = fn(*args)
        if inspect.iscoroutine(result):
            result = _drive_coroutine(result)
        return result
    for h in reversed(handlers):
        body = (lambda inner, h: lambda: h.run(inner))(body, h)
    return body


def _drive_coroutine(coro):
    # Runs on the fiber: step the coroutine here (so that its performs see the
    # fiber's handlers) and pass what it yields, a future for the task to wait
    # on, out to the driver; what the task sends back goes in again.
    send, value = True, None
    while True:
        try:
            yielded = coro.send(value) if send else coro.throw(value)
        except StopIteration as stop:
            return stop.value
        try:
            send, value = True, perform(_YIELD, yielded)
        except BaseException as exc:
            send, value = False, exc


def _under_run(body):
    with _UNDER_RUN_HANDLER:                # outside every handler the body installs
        return body()


class _Driver:
    """The awaitable run() returns: drives the fiber from the awaiting task."""

    __slots__ = ("_stepper", "__weakref__")

    def __init__(self, body):
        self._stepper = Stepper(_under_run, body, catch=(_YIELD,))

    def __await__(self):
        stepper = self._stepper
        if stepper.state != Stepper.NEW:
            raise RuntimeError("a kina_fx.aio.run() coroutine can be awaited only once")
        state = stepper.step()
        while state == Stepper.SUSPENDED:
            try:
                value = yield stepper.args[0]
            except GeneratorExit:
                # The awaiting coroutine is closed without finishing: cancel the
                # fiber (its cleanup runs) and let the close go on.
                stepper.cancel()
                raise
            except BaseException as exc:
                state = stepper.throw(exc)
            else:
                state = stepper.step(value)
        if state == Stepper.DONE:
            return stepper.result
        raise stepper.error

    def __repr__(self):
        return f"<kina_fx.aio.run {self._stepper.state}>"


def _as_iterator(awaitable):
    if not inspect.isawaitable(awaitable):
        raise TypeError(f"await_only needs an awaitable, not {awaitable!r}")
    iterator = awaitable.__await__()
    if not hasattr(iterator, "throw"):         # a plain iterator: give it send and throw
        iterator = _delegate(iterator)
    return iterator


def _delegate(iterator):
    return (yield from iterator)


class AsyncContinuation:
    """What an ``async def`` ``on`` clause receives: ``await k.resume(v)``.

    Awaited by the clause (directly, or through await_only from code it
    calls), the resumed code runs right there, on the clause's fiber, under the
    same handlers as after a plain clause's ``k.resume(v)``.  Awaited by
    another task (``asyncio.create_task``, ``gather``; ``wait_for`` before
    Python 3.12, which since awaits in the caller's own task), it runs
    on a fiber of its own driven by that task, under that task's handlers.
    Like the continuation it wraps, it is one-shot.
    """

    __slots__ = ("_k",)

    def __init__(self, k):
        self._k = k

    def resume(self, value=None):
        """A coroutine: continue the handled code with ``value``; return the handler's result."""
        return _continue(self._k, False, value)

    def discontinue(self, exc):
        """A coroutine: continue the handled code by raising ``exc`` at its perform."""
        return _continue(self._k, True, exc)

    @property
    def resumed(self) -> bool:
        return self._k.resumed

    def __repr__(self):
        return f"<AsyncContinuation of {self._k!r}>"


async def _continue(k, throw, value):
    if perform(_UNDER_RUN):
        # On the fiber (the result is stored first: not a tail resume, since
        # the awaiting coroutine wants it).
        result = k.discontinue(value) if throw else k.resume(value)
        return result
    return await _Driver(lambda: k.discontinue(value) if throw else k.resume(value))


# An async clause is called by a plain clause that steps its coroutine on the
# fiber where the plain clause runs.
_CLAUSE_OUTSIDE_RUN = "an async clause of kina_fx.aio.handler() runs only under kina_fx.aio.run()"


def _awaiting_fun(clause):
    def fun(*args):
        return _on_fiber(clause(*args), _CLAUSE_OUTSIDE_RUN)
    fun.__name__ = fun.__qualname__ = getattr(clause, "__name__", "async_fun")
    fun.__wrapped__ = clause
    return fun


def _awaiting_on(clause):
    def on(k, *args):
        return _on_fiber(clause(AsyncContinuation(k), *args), _CLAUSE_OUTSIDE_RUN)
    on.__name__ = on.__qualname__ = getattr(clause, "__name__", "async_on")
    on.__wrapped__ = clause
    return on


def _awaiting_value(clause):
    def value(x):
        return _on_fiber(clause(x), _CLAUSE_OUTSIDE_RUN)
    value.__wrapped__ = clause
    return value


def handler(on=None, fun=None, ret=None, exc=None) -> Handler:
    """A :class:`~kina_fx.handlers.Handler` whose ``async def`` clauses
    (``on``, ``fun``, ``ret`` or ``exc``) are awaited on the running event loop.
    Clauses that are plain functions are used as they are."""
    def wrap(clauses, make):
        return {effect: make(c) if inspect.iscoroutinefunction(c) else c
                for effect, c in dict(clauses or {}).items()}
    return Handler(on=wrap(on, _awaiting_on), fun=wrap(fun, _awaiting_fun),
                   ret=_awaiting_value(ret) if inspect.iscoroutinefunction(ret) else ret,
                   exc=_awaiting_value(exc) if inspect.iscoroutinefunction(exc) else exc)
