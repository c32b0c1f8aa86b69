"""The effects part of the typed user program (Effect, Handler, perform).

mypy --strict checks it now, calls into kina_fx.handlers being exempt from
disallow_untyped_calls (pyproject.toml) until handlers.py carries the typed,
generic Effect of issue 12; pyright skips this file until then
(pyrightconfig.json).  Drop both exemptions once it lands.
"""
from __future__ import annotations

from kina_fx import Effect, Handler, perform


def effects() -> int:
    ask = Effect("typing.ask")
    answer = Handler(on={ask: lambda k: k.resume(41)}).run(lambda: perform(ask) + 1)
    return int(answer)


if __name__ == "__main__":
    assert effects() == 42
    print("typed effects program: ok")
