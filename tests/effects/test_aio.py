"""The asyncio bridge (kina_fx.aio), on a real event loop."""
import asyncio
import contextvars

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
