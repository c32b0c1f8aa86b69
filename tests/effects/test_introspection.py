"""Declared and found effect sets (kina_fx.introspection)."""
import functools

import pytest

from kina_fx import Effect, Handler, perform
from kina_fx import introspection as intro
from kina_fx.introspection import effects, performs, unhandled_effects
from kina_fx.multishot import MultiHandler
from kina_fx.testing import ScriptedHandler

Read = Effect("test.intro.read")
Write = Effect("test.intro.write")
Log = Effect("test.intro.log")
Secret = Effect("test.intro.secret")


def read_line():
    return perform(Read)


def write_line(s):
    Write(s)                      # calling the effect names it too


def copy():
    write_line(read_line())
    return "copied"


def logged(fn):
    def wrapper(*a):
        perform(Log, fn.__name__)
        return fn(*a)
    return wrapper


@performs(Secret)
def opaque(callback):
    return callback()            # what it really performs is only known by declaration


def test_found_transitively_through_helpers():
    assert effects(read_line) == {Read}
    assert effects(copy) == {Read, Write}


def test_closures_lambdas_partials_and_methods():
    wrapped = logged(copy)
    assert effects(wrapped) == {Log, Read, Write}
    assert effects(lambda: [perform(Read) for _ in range(2)]) == {Read}
    assert effects(functools.partial(perform, Log)) == {Log}

    class Service:
        def run(self):
            return copy()
    assert effects(Service().run) == {Read, Write}


def test_module_attributes_are_followed():
    import sys
    import types
    helpers = types.ModuleType("intro_helpers")
    helpers.read_line = read_line
    user = types.ModuleType("intro_user")
    sys.modules["intro_helpers"] = helpers
    try:
        exec("import intro_helpers\ndef uses_module():\n    return intro_helpers.read_line()\n", user.__dict__)
    finally:
        del sys.modules["intro_helpers"]
    assert effects(user.uses_module) == {Read}


def test_declared_sets_are_trusted_and_transitive():
    assert effects(opaque) == {Secret}

    def main():
        return opaque(copy)
    assert effects(main) == {Secret, Read, Write}   # main names copy as well
    with pytest.raises(TypeError):
        performs("not an effect")


def test_recursion_terminates():
    def even(n):
        return True if n == 0 else odd(n - 1)

    def odd(n):
        perform(Log, n)
        return False if n == 0 else even(n - 1)
    assert effects(even) == {Log}


def test_unhandled_effects_before_running():
    reader = Handler(fun={Read: lambda: "line"})
    writer = Handler(on={Write: lambda k, s: k.resume(None)})
    assert unhandled_effects(copy) == {Read, Write}
    assert unhandled_effects(copy, reader) == {Write}
    assert unhandled_effects(copy, reader, writer) == set()
    assert unhandled_effects(copy, ScriptedHandler({Read: "x"}), MultiHandler(on={Write: lambda k, s: None})) == set()
    defaulted = Effect("test.intro.defaulted")
    defaulted.default = lambda: 0
    try:
        assert unhandled_effects(lambda: perform(defaulted)) == set()
    finally:
        defaulted.default = None
    with pytest.raises(TypeError):
        intro.handled_by(object())
