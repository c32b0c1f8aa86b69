"""A typed program on kina_fx's effects: mypy and pyright must accept it as it is
(tests/package/test_typing.py checks both)."""
from __future__ import annotations

from typing import Any, Dict, List

from kina_fx import Continuation, Effect, Handler, perform

Get: Effect[[], int] = Effect("typed.get")
Put: Effect[[int], None] = Effect("typed.put")
Ask: Effect[[str, int], bool] = Effect("typed.ask")
Log: Effect[[str], None] = Effect("typed.log")


def counter() -> int:
    perform(Put, perform(Get) + 1)
    again: bool = perform(Ask, "again?", 2)
    if again:
        Put(Get() * 2)                      # calling an effect performs it
    perform(Log, f"value {Get()}")
    return Get()


def state_handler(initial: int) -> Handler:
    cell: List[int] = [initial]

    def get(k: Continuation[int, Any]) -> Any:
        return k.resume(cell[0])

    def put(k: Continuation[None, Any], value: int) -> Any:
        cell[0] = value
        return k.resume(None)
    return Handler(on=[Get.on(get), Put.on(put)],
                   fun=[Ask.fun(lambda question, times: times > 1)],
                   ret=lambda result: (result, cell[0]))


def main() -> Dict[str, Any]:
    lines: List[str] = []
    logger = Handler(fun=[Log.fun(lambda line: lines.append(line))])
    result = logger.run(lambda: state_handler(20).run(counter))
    return {"result": result, "log": lines}


if __name__ == "__main__":
    print(main())
