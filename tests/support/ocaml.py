"""What the ports of OCaml 5's effect-handler programs share (tests/effects/ocaml/).

Sources (re-expressed in Python against the kina_fx API, not copied):

* ocaml/ocaml ``testsuite/tests/effects/*.ml`` and ``testsuite/tests/effect-syntax/*.ml``
  (each port checks the output of the program's ``.reference`` file, or what
  the program asserts);
* the OCaml manual's effects chapter (``manual/src/refman/extensions/effects.etex``);
* ocaml-multicore/effects-examples (generator, state, sched + concurrent, pipes,
  reify_reflect, fringe, transaction, dyn_wind, promises, ref, mvar, loop,
  eratosthenes, algorithmic_differentiation);
* differential checks (hypothesis) of `on`/`fun`/`with` clauses, a scheduler and
  shallow vs deep state against direct models of OCaml's semantics.

Mapping used throughout:

* ``match_with f v {retc; exnc; effc}`` -> ``Handler(on=..., ret=..., exc=...).run(f, v)``;
  ``try_with`` -> the same without ``ret``/``exc``; an effc returning ``None``
  for an effect -> that effect is simply not listed in ``on``.
* ``continue k v`` -> ``k.resume(v)``; ``discontinue k e`` -> ``k.discontinue(e)``;
  ``Effect.Shallow.fiber``/``continue_with`` -> ``fiber``/``k.resume_with``.
* ``failwith s`` -> ``raise Failure(s)``; OCaml's ``Unhandled`` -> ``kina_fx.Unhandled``;
  ``Continuation_already_resumed`` -> ``ContinuationAlreadyResumed``.
* Effects declared inside a functor / local module (fresh per instantiation) use
  :func:`fresh` (``Effect`` is interned by name, so a fresh effect needs a new name).

Programs that only make sense in OCaml (multi-shot ``Obj.clone_continuation``,
``Marshal``, structural compare/hash of continuations, ``Lazy`` across domains,
GC-only stress tests) are either ported to the closest Python analog (asserting
a clear error) or skipped with the reason in a comment (the end of
tests/effects/ocaml/test_ocaml_testsuite.py lists them).
"""
from __future__ import annotations

import itertools
import threading

from kina_fx import Effect, Handler, fiber

_fresh_ids = itertools.count()


def fresh(name: str) -> Effect:
    """A new effect, like a ``type _ Effect.t += ...`` inside a functor body."""
    return Effect(f"ocaml_ports.{name}.{next(_fresh_ids)}")


class Failure(Exception):
    """OCaml's ``Failure`` (raised by ``failwith``)."""


def failwith(msg):
    raise Failure(msg)


def reraise(e):
    """``exnc = raise``."""
    raise e


class Out:
    """Collects what an OCaml program would print."""

    def __init__(self):
        self.parts = []

    def __call__(self, *parts):
        self.parts.extend(str(p) for p in parts)

    def line(self, s=""):
        self.parts.append(f"{s}\n")

    @property
    def text(self):
        return "".join(self.parts)


def in_own_thread(fn, *args):
    """Run fn in a fresh OS thread (its own fiber runtime state), so that a
    runtime corrupted by a bug cannot break the tests that run after it."""
    box = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def isprime(n):
    if n == 2:
        return True
    if n % 2 == 0:
        return False
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def handle_state(Get, Set, init, f, x):
    def loop(state, k, x):
        return k.resume_with(x, Handler(
            ret=lambda result: (result, state),
            exc=reraise,
            on={Get: lambda k: loop(state, k, state),
                Set: lambda k, new_state: loop(new_state, k, None)}))
    return loop(init, fiber(f), x)


def run_state(Get, Set, f):
    return Handler(ret=lambda v: (lambda s: (v, s)),
                   on={Get: lambda k: (lambda s: k.resume(s)(s)),
                       Set: lambda k, n: (lambda _s: k.resume(None)(n))}).run(f)
