"""Clear errors for the two common mistakes in writing a Handler (issue 11):
a list where the clauses' dict belongs, and a clause with the wrong parameters.
Checked on both implementations (the impl fixture)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from kina_fx import Effect, Handler, perform

Ask = Effect("messages.ask")


@pytest.mark.parametrize("what", ["on", "fun"])
def test_a_list_instead_of_a_dict(what):
    with pytest.raises(TypeError, match=rf"{what} must map each Effect to its clause, as in "
                                        rf"Handler\({what}=\{{effect: clause\}}\) or "
                                        rf"Handler\({what}=\[effect\.{what}\(clause\)\]\)"):
        Handler(**{what: [Ask]})


def test_clauses_of_any_signature_are_accepted_at_construction():
    """Parameters are not inspected when a handler is built (that would cost every
    handler); a mismatch is explained when the clause is called."""
    Handler(on={Ask: lambda: 1}), Handler(fun={Ask: lambda *, x: x}), Handler(fun={Ask: print})


def test_methods_and_callable_objects_work_as_clauses():
    class Clauses:
        def on_ask(self, k, *args):
            return k.resume(len(args))

        def __call__(self, *args):
            return len(args)

    c = Clauses()
    assert Handler(on={Ask: c.on_ask}).run(lambda: perform(Ask, 1, 2)) == 2
    assert Handler(fun={Ask: c}).run(lambda: perform(Ask, 1, 2, 3)) == 3


SCRIPT = r"""
from kina_fx import Effect, Handler, perform
Ask = Effect("messages.ask")

def fun_ask(x):
    return x

def on_ask(k):
    return k.resume(1)

def inside(x):
    return len(x)

def no_continuation():
    return 1

def keyword_only(*, x):
    return x

for name, attempt in [
    ("fun", lambda: Handler(fun={Ask: fun_ask}).run(lambda: perform(Ask, 1, 2, 3))),
    ("on", lambda: Handler(on={Ask: on_ask}).run(lambda: perform(Ask, 1, 2))),
    ("inside", lambda: Handler(fun={Ask: inside}).run(lambda: perform(Ask, 5))),
    ("no_k", lambda: Handler(on={Ask: no_continuation}).run(lambda: perform(Ask))),
    ("keyword", lambda: Handler(fun={Ask: keyword_only}).run(lambda: perform(Ask, 1))),
]:
    try:
        attempt()
    except TypeError as exc:
        print(name, "|", exc)
"""

WITH_SCRIPT = r"""
from kina_fx import Effect, Handler, perform
Ask = Effect("messages.ask")

def fun_ask(x):
    return x

try:
    with Handler(fun={Ask: fun_ask}):
        perform(Ask)
except TypeError as exc:
    print("with |", exc)
"""


@pytest.fixture
def run_python():
    """Run a script in a fresh interpreter, on this test's implementation (inherited)."""
    def run(script):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return dict(line.split(" | ", 1) for line in out.stdout.splitlines())
    return run


def test_wrong_number_of_arguments_names_the_effect_and_the_call(run_python):
    got = run_python(SCRIPT)
    assert got["fun"] == ("fun_ask() takes 1 positional argument but 3 were given (the 'fun' "
                          "clause for Effect('messages.ask') of <Handler messages.ask(fun)>; a "
                          "'fun' clause is called as clause(*args): the arguments of perform)")
    assert got["on"].startswith("on_ask() takes 1 positional argument but 3 were given (the 'on' "
                                "clause for Effect('messages.ask') of <Handler messages.ask>; an "
                                "'on' clause is called as clause(k, *args)")
    assert got["no_k"].startswith("no_continuation() takes 0 positional arguments but 1 was "
                                  "given (the 'on' clause for Effect('messages.ask')")
    assert "(the 'fun' clause for Effect('messages.ask')" in got["keyword"]
    # A TypeError raised inside a clause is the clause's own: left as it is.
    assert got["inside"] == "object of type 'int' has no len()"


def test_the_with_form_explains_too(run_python):
    assert run_python(WITH_SCRIPT)["with"].startswith(
        "fun_ask() missing 1 required positional argument: 'x' (the 'fun' clause for "
        "Effect('messages.ask')")
