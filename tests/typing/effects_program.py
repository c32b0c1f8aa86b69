"""The effects part of the typed user program (Effect, Handler, perform),
checked by ``make typecheck`` (mypy --strict and pyright in strict mode) with
the typed, generic Effect of issue 12; tests/typing/typed_example.py is the
longer one."""
from __future__ import annotations

from kina_fx import Effect, Handler, perform


def effects() -> int:
    ask: Effect[[], int] = Effect("typing.ask")
    answer = Handler(on=[ask.on(lambda k: k.resume(41))]).run(lambda: perform(ask) + 1)
    return int(answer)


if __name__ == "__main__":
    assert effects() == 42
    print("typed effects program: ok")
