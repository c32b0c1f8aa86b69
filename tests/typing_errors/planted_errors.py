"""Typing errors mypy and pyright must both report, one per line marked
``# planted``, and nothing else (tests/package/test_typing.py)."""
from __future__ import annotations

from typing import Any

from kina_fx import Continuation, Effect, Handler, perform

Get: Effect[[], int] = Effect("planted.get")
Put: Effect[[int], None] = Effect("planted.put")
Ask: Effect[[str, int], bool] = Effect("planted.ask")


def performs_badly() -> None:
    perform(Put, "one")  # planted: an argument of the wrong type
    name: str = perform(Get)  # planted: the answer is an int
    perform(Ask, "question")  # planted: a missing argument
    perform(Get, 1)  # planted: an argument too many
    Put(value=1)  # planted: effects take positional arguments only
    print(name)


def put_with_str(k: Continuation[None, Any], value: str) -> Any:
    return k.resume(None)


def clauses_badly() -> Handler:
    return Handler(
        on=[Put.on(lambda k: k.resume(None))],  # planted: Put's clause takes (k, value)
        fun=[Ask.fun(lambda question: True)])  # planted: Ask's clause takes two arguments


def clauses_badly_too() -> Handler:
    return Handler(on=[Put.on(put_with_str)],  # planted: value is an int, not a str
                   fun=[Get.fun(lambda: "zero")])  # planted: Get answers an int
