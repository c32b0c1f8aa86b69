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

__all__ = ["run", "handler", "await_only", "AsyncContinuation"]

# Performed by code under run() to hand something to the event loop.  Private
# effects (ids like any other), caught by run()'s Stepper and nothing else.
_AWAIT = Effect("kina.aio.await")          # await this awaitable, answer its result
_YIELD = Effect("kina.aio.yield")          # a coroutine's raw yield to the task
# Answered True by an in-place handler at the bottom of every run(): "this code
# runs on a fiber whose awaits reach the loop".
_UNDER_RUN = Effect("kina.aio.under_run")


def _outside_run(*args):
    for awaitable in args:
        if inspect.iscoroutine(awaitable):
            awaitable.close()        # never awaited: say so once, here, not as a warning
    raise ValidationError("kina_fx.aio.await_only() needs a caller running under kina_fx.aio.run()")


_AWAIT.default = _outside_run
_YIELD.default = _outside_run
_UNDER_RUN.default = lambda: False
_UNDER_RUN_HANDLER = Handler(fun={_UNDER_RUN: lambda: True})


def await_only(awaitable):
    """From synchronous code running under :func:`run`: await ``awaitable`` on
    the event loop and return its result (raise its exception)."""
    return perform(_AWAIT, awaitable)


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

    def under_run(handled=body):
        with _UNDER_RUN_HANDLER:            # outside every handler of the list
            return handled()
    return under_run


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


class _Driver:
    """The awaitable run() returns: drives the fiber from the awaiting task."""

    __slots__ = ("_stepper", "__weakref__")

    def __init__(self, body):
        self._stepper = Stepper(body, catch=(_AWAIT, _YIELD))

    def __await__(self):
        stepper = self._stepper
        if stepper.state != Stepper.NEW:
            raise RuntimeError("a kina_fx.aio.run() coroutine can be awaited only once")
        state = stepper.step()
        while state == Stepper.SUSPENDED:
            effect, payload = stepper.effect, stepper.args[0]
            try:
                if effect is _AWAIT:
                    value = yield from _as_iterator(payload)
                else:
                    value = yield payload
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
    if inspect.iscoroutine(awaitable):
        return awaitable.__await__()
    if not inspect.isawaitable(awaitable):
        raise TypeError(f"await_only needs an awaitable, not {awaitable!r}")
    return awaitable.__await__()


class AsyncContinuation:
    """What an ``async def`` ``on`` clause receives: ``await k.resume(v)``.

    Awaited by the clause itself, the resumed code runs right there, on the
    clause's fiber, under the same handlers as after a plain clause's
    ``k.resume(v)``; its awaits reach the loop through that fiber.  Awaited
    from another task (``asyncio.create_task``, ``gather``, ``wait_for``), it
    runs on a fiber of its own driven by that task, under that task's
    handlers.  Like the continuation it wraps, it is one-shot.
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
        # Not a tail resume (the result is stored first): the clause's
        # coroutine is waiting for it.
        result = k.discontinue(value) if throw else k.resume(value)
        return result
    return await _Driver(lambda: k.discontinue(value) if throw else k.resume(value))


# An async clause is run by a plain clause that steps its coroutine on the
# fiber, where the plain clause itself runs: so its performs and the code it
# resumes see the handlers a plain clause would (the ones outside its own).
def _stepped(coro):
    if not perform(_UNDER_RUN):
        coro.close()                 # never started: no "never awaited" warning
        raise ValidationError("an async clause of kina_fx.aio.handler() runs only under kina_fx.aio.run()")
    return _drive_coroutine(coro)


def _awaiting_fun(clause):
    def fun(*args):
        return _stepped(clause(*args))
    fun.__name__ = fun.__qualname__ = getattr(clause, "__name__", "async_fun")
    fun.__wrapped__ = clause
    return fun


def _awaiting_on(clause):
    def on(k, *args):
        return _stepped(clause(AsyncContinuation(k), *args))
    on.__name__ = on.__qualname__ = getattr(clause, "__name__", "async_on")
    on.__wrapped__ = clause
    return on


def _awaiting_value(clause):
    def value(x):
        return _stepped(clause(x))
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
