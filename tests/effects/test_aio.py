"""The asyncio bridge (kina_fx.aio), on a real event loop."""
import asyncio
import contextvars
import sys

import pytest

from kina_fx import Effect, Handler, Unhandled, ValidationError, aio, perform

Fetch = Effect("test.aio.fetch")
Log = Effect("test.aio.log")
Get = Effect("test.aio.get")
Ask = Effect("test.aio.ask")


def run(coro):
    return asyncio.run(coro)


async def fetch(url):
    await asyncio.sleep(0.001)
    return f"<{url}>"


def crawl(urls):
    return [perform(Fetch, u) for u in urls]


def test_async_fun_clause_is_awaited_and_resumes_sync_code():
    h = aio.handler(fun={Fetch: fetch})
    assert run(aio.run(crawl, ["a", "b"], handlers=[h])) == ["<a>", "<b>"]


def test_handler_mixes_sync_and_async_clauses():
    logged = []

    async def ask(k, question):
        await asyncio.sleep(0)
        return await k.resume(question.upper())

    h = aio.handler(fun={Fetch: fetch, Log: logged.append},
                    on={Get: lambda k: k.resume(10), Ask: ask})

    def body():
        perform(Log, "start")
        a = perform(Ask, "q")
        n = perform(Get)
        page = perform(Fetch, a)
        perform(Log, page)
        return n, page
    assert run(aio.run(body, handlers=[h])) == (10, "<Q>")
    assert logged == ["start", "<Q>"]


def test_async_on_clause_may_answer_without_resuming():
    async def stop(k, v):
        await asyncio.sleep(0)
        return ("stopped", v)
    h = aio.handler(on={Ask: stop})
    assert run(aio.run(lambda: perform(Ask, 3) + 1, handlers=[h])) == ("stopped", 3)


def test_await_only_from_plain_code_and_outside_run():
    def body():
        return aio.await_only(asyncio.sleep(0, result="slept"))
    assert run(aio.run(body)) == "slept"
    with pytest.raises(ValidationError, match="aio.run"):
        body()


def test_effects_performed_from_a_coroutine_under_a_handler():
    async def body(n):
        total = 0
        for i in range(n):
            await asyncio.sleep(0)           # a raw await reaches the event loop
            total += perform(Get) + perform(Fetch, i).count("<")   # sync performs
        return total
    h = aio.handler(fun={Fetch: fetch}, on={Get: lambda k: k.resume(2)})
    assert run(aio.run(body, 5, handlers=[h])) == 5 * 3


def test_concurrent_tasks_each_under_their_own_handlers():
    order = []

    def worker(name, n):
        seen = []
        for _ in range(n):
            seen.append(perform(Get))
            order.append(name)
            perform(Fetch, name)             # suspends this task's fiber only
        return name, seen

    async def main():
        tasks = []
        for name, value in (("a", 1), ("b", 2), ("c", 3)):
            async def sleepy(url, value=value):
                await asyncio.sleep(0.001 * value)
                return url
            h = aio.handler(fun={Get: (lambda v: lambda: v)(value), Fetch: sleepy})
            tasks.append(asyncio.create_task(aio.run(worker, name, 4, handlers=[h])))
        return await asyncio.gather(*tasks)
    results = run(main())
    assert results == [("a", [1] * 4), ("b", [2] * 4), ("c", [3] * 4)]
    assert order[:3] == ["a", "b", "c"]       # they interleave on the loop
    assert order != sorted(order)


def test_timeout_cancels_and_unwinds_the_fiber():
    events = []

    async def slow(url):
        await asyncio.sleep(10)

    def body():
        try:
            perform(Fetch, "x")
        finally:
            events.append("finally ran")

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(aio.run(body, handlers=[aio.handler(fun={Fetch: slow})]), 0.01)
    run(main())
    assert events == ["finally ran"]


def test_task_cancellation_unwinds_nested_handlers_and_coroutines():
    events = []
    started = asyncio.Event

    async def slow(url):
        try:
            await asyncio.sleep(10)
        finally:
            events.append("clause")

    def inner():
        try:
            perform(Fetch, "x")
        finally:
            events.append("inner")

    async def body(ready):
        try:
            ready.set()
            return Handler(on={Get: lambda k: k.resume(0)}).run(inner)
        finally:
            events.append("coroutine")

    async def main():
        ready = started()
        task = asyncio.create_task(aio.run(body, ready, handlers=[aio.handler(fun={Fetch: slow})]))
        await ready.wait()
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
    run(main())
    assert events == ["clause", "inner", "coroutine"]


def test_exceptions_of_async_clauses_are_raised_at_the_perform():
    async def broken(url):
        await asyncio.sleep(0)
        raise KeyError(url)

    def body():
        try:
            perform(Fetch, "missing")
        except KeyError as e:
            return "caught " + e.args[0]
    assert run(aio.run(body, handlers=[aio.handler(fun={Fetch: broken})])) == "caught missing"

    with pytest.raises(KeyError):
        run(aio.run(lambda: perform(Fetch, "x"), handlers=[aio.handler(fun={Fetch: broken})]))


def test_body_exception_reaches_the_awaiting_task_and_exc_clause():
    def body():
        perform(Fetch, "x")
        raise ValueError("body")
    with pytest.raises(ValueError, match="body"):
        run(aio.run(body, handlers=[aio.handler(fun={Fetch: fetch})]))

    async def exc(e):
        await asyncio.sleep(0)
        return ("handled", type(e).__name__)
    h = aio.handler(fun={Fetch: fetch}, exc=exc)
    assert run(aio.run(body, handlers=[h])) == ("handled", "ValueError")


def test_unhandled_effect_inside_run_is_raised_at_the_perform():
    def body():
        try:
            perform(Ask)
        except Unhandled as e:
            return e.effect
    assert run(aio.run(body)) is Ask


def test_outer_handlers_around_the_task_answer_forwarded_effects():
    async def main():
        return await aio.run(lambda: perform(Get) + 1)
    with Handler(fun={Get: lambda: 41}):
        assert run(main()) == 42


def test_context_variables_flow_into_the_fiber():
    var = contextvars.ContextVar("test_aio_var", default="unset")

    async def main():
        var.set("task")
        return await aio.run(lambda: (var.get(), aio.await_only(fetch(var.get()))))
    assert run(main()) == ("task", "<task>")


def test_run_is_awaited_once_and_checks_its_arguments():
    with pytest.raises(TypeError):
        aio.run(42)
    with pytest.raises(TypeError):
        aio.run(crawl, [], handlers=[object()])

    async def main():
        r = aio.run(lambda: 1)
        assert await r == 1
        with pytest.raises(RuntimeError):
            await r
    run(main())


# --- handler order and clause scope (issue 16) -------------------------------------
# run()'s handlers nest as Handler.run calls do, outermost first: whatever the
# handled code and the clauses perform must reach the same handlers as in the
# synchronous program with the same nesting.

def run_sync_and_async(body, make_handlers):
    """``body`` under ``make_handlers(asynchronous)`` (outermost first): once nested
    with Handler.run, once through aio.run; returns both outcomes."""
    def nested(handlers):
        fn = body
        for h in reversed(handlers):
            fn = (lambda inner, h: lambda: h.run(inner))(fn, h)
        return fn()

    outcomes = []
    for asynchronous in (False, True):
        try:
            if asynchronous:
                value = run(aio.run(body, handlers=make_handlers(True)))
            else:
                value = nested(make_handlers(False))
            outcomes.append(("returned", value))
        except Exception as e:
            outcomes.append(("raised", type(e).__name__, str(e)))
    return outcomes


def test_handlers_listed_before_an_async_on_handler_stay_installed_after_resume():
    # The reproduction: Log was Unhandled after `await k.resume(42)`.
    logged = []

    def body():
        x = perform(Ask)
        perform(Log, "resumed")
        return x

    async def ask(k):
        return await k.resume(42)

    assert run(aio.run(body, handlers=[Handler(fun={Log: logged.append}),
                                       aio.handler(on={Ask: ask})])) == 42
    assert logged == ["resumed"]


def clause_kinds(logged):
    """For each kind of clause: a sync and an async version that performs Log."""
    async def async_on(k):
        perform(Log, "on clause")
        await asyncio.sleep(0)
        return await k.resume(1)

    def sync_on(k):
        perform(Log, "on clause")
        return k.resume(1)

    async def async_fun():
        perform(Log, "fun clause")
        await asyncio.sleep(0)
        return 1

    def sync_fun():
        perform(Log, "fun clause")
        return 1

    async def async_ret(v):
        perform(Log, "ret clause")
        await asyncio.sleep(0)
        return v * 10

    def sync_ret(v):
        perform(Log, "ret clause")
        return v * 10

    async def async_exc(e):
        perform(Log, "exc clause")
        await asyncio.sleep(0)
        return "handled " + type(e).__name__

    def sync_exc(e):
        perform(Log, "exc clause")
        return "handled " + type(e).__name__

    return {"on": (dict(on={Ask: sync_on}), dict(on={Ask: async_on})),
            "fun": (dict(fun={Ask: sync_fun}), dict(fun={Ask: async_fun})),
            "ret": (dict(on={Ask: sync_on}, ret=sync_ret), dict(on={Ask: async_on}, ret=async_ret)),
            "exc": (dict(fun={Ask: sync_fun}, exc=sync_exc), dict(fun={Ask: async_fun}, exc=async_exc))}


@pytest.mark.parametrize("kind", ["on", "fun", "ret", "exc"])
@pytest.mark.parametrize("raises", [False, True])
def test_async_clauses_perform_to_the_handlers_outside_their_own(kind, raises):
    logged = []

    def body():
        x = perform(Ask)
        perform(Log, "body")
        if raises:
            raise KeyError(x)
        return x

    def make(asynchronous):
        clauses = clause_kinds(logged)[kind][asynchronous]
        return [Handler(fun={Log: logged.append}), aio.handler(**clauses)]

    outcomes = run_sync_and_async(body, make)
    assert outcomes[1] == outcomes[0]
    half = len(logged) // 2
    assert logged[:half] == logged[half:] and len(logged) >= 2


@pytest.mark.parametrize("how", ["returns", "raises"])
def test_async_on_clause_that_drops_k_aborts_the_body_before_the_caller_sees_it(how):
    events = []

    async def drop(k):
        await asyncio.sleep(0)
        if how == "raises":
            raise KeyError("clause")
        return "early"

    def body():
        try:
            perform(Ask)
        finally:
            events.append("body finally")

    async def main():
        try:
            value = await aio.run(body, handlers=[aio.handler(on={Ask: drop})])
        except KeyError:
            value = "KeyError"
        events.append(("caller sees", value))
    run(main())
    assert events == ["body finally", ("caller sees", "early" if how == "returns" else "KeyError")]


def test_resumed_code_awaits_on_the_loop_under_every_handler():
    # After `await k.resume(v)` the handled code still reaches the loop (its own
    # awaits, async fun clauses) and the outer handlers, at any depth of resumes
    # (each resume nested a new fiber and driver before: RecursionError at 1,000).
    logged = []

    async def ask(k, i):
        return await k.resume(i)

    def body(n):
        total = 0
        for i in range(n):
            total += perform(Ask, i)
            total += perform(Fetch, str(i)).count("<")
            perform(Log, i)
        return total

    n = 2000
    h = [Handler(fun={Log: logged.append}), aio.handler(on={Ask: ask}, fun={Fetch: fetch})]
    assert run(aio.run(body, n, handlers=h)) == sum(range(n)) + n
    assert logged == list(range(n))


# wait_for ran its awaitable in a task of its own before Python 3.12; since, in the caller's task.
ANOTHER_TASK = {"create_task": lambda aw: asyncio.get_running_loop().create_task(aw),
                "gather": lambda aw: asyncio.gather(aw)}
if sys.version_info < (3, 12):
    ANOTHER_TASK["wait_for"] = lambda aw: asyncio.wait_for(aw, 10)


@pytest.mark.parametrize("in_task", ANOTHER_TASK)
def test_resume_awaited_by_another_task_runs_under_that_tasks_handlers(in_task):
    # A continuation resumed from a separate task runs there: its performs
    # reach that task's handlers.
    logged = []
    wrap = ANOTHER_TASK[in_task]

    async def ask(k):
        result = await wrap(k.resume(5))
        return result[0] if in_task == "gather" else result

    def body():
        x = perform(Ask)
        perform(Log, "after")
        return aio.await_only(asyncio.sleep(0, result=x))

    h = [Handler(fun={Log: logged.append}), aio.handler(on={Ask: ask})]
    with pytest.raises(Unhandled):
        run(aio.run(body, handlers=h))
    with Handler(fun={Log: lambda m: logged.append(("task", m))}):
        assert run(aio.run(body, handlers=h)) == 5
    assert logged == [("task", "after")]


def test_await_only_runs_the_awaitable_where_it_is_awaited():
    # A coroutine awaited from sync code (await_only) performs to the handlers
    # of that code, and a continuation resumed that way keeps them too.
    logged = []

    async def noted(x):
        perform(Log, ("noted", x))
        await asyncio.sleep(0)
        return x

    async def ask(k):
        return helper(k)

    def helper(k):                       # sync code called by the async clause
        return aio.await_only(k.resume(aio.await_only(noted(7))))

    def body():
        x = perform(Ask)
        perform(Log, ("after", x))
        return aio.await_only(noted(x + 1))

    h = [Handler(fun={Log: logged.append}), aio.handler(on={Ask: ask})]
    assert run(aio.run(body, handlers=h)) == 8
    assert logged == [("noted", 7), ("after", 7), ("noted", 8)]


def test_multi_handler_replays_wait_on_their_own_futures():
    # A replay re-runs the body, awaits included: its coroutines make new
    # futures, which it must wait on (the first run's answers do not fit them).
    # Found by the differential tests: ReplayDiverged ("await wasn't used with
    # future" in the replay).
    from kina_fx.multishot import MultiHandler

    Choose = Effect("test.aio.choose")
    awaited = []

    async def slow(x):
        await asyncio.sleep(0.001)
        awaited.append(x)
        return x * 10

    def body():
        before = aio.await_only(slow(1))
        choice = perform(Choose, (1, 2))
        return before + aio.await_only(slow(choice))

    h = MultiHandler(on={Choose: lambda k, xs: [k.resume(x) for x in xs]})
    assert run(aio.run(body, handlers=[h])) == [20, 30]
    assert awaited == [1, 1, 1, 2]          # the first run, then the replay for the second shot
