"""The nesting model of Python Tapes (test_tape_nesting_model.py) with compiled code among its ops.

Besides the model's rules, a step may call a compiled function
(tests/hosts/c/compiled_fixture.c's ``exp_and_square``, built with gcc against
libkina_fx.so: y = exp(x), z = y * y through the runtime's exports) on a
value cast to float32, inside whatever tapes record: the call's runtime ops
are recorded by a buffer tracer nested in them.  Its outputs are values the
tapes differentiate further, and every gradient is checked as before
(float32 tolerances: each value is checked against what the step computed
from the values it was given, and gradients to 2e-3).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from support.abi import build_fixture_library
from test_tape_nesting_model import NestingModel, Op, traced

from kina_fx import autograd as ad
from kina_fx import compiled
from kina_fx.errors import KinaTypeError

pytestmark = pytest.mark.integration
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
M = "kina_unranked_memref_t *"
FIXTURE = Path(__file__).parent.parent / "hosts" / "c" / "compiled_fixture.c"


class CompiledNesting(NestingModel):
    VALUE_RTOL, VALUE_ATOL, GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-5, 2e-3, 2e-4
    REBASE = True
    exp_and_square = None          # set by the test below (the built fixture)

    @rule(data=st.data())
    def compiled_call(self, data):
        i = data.draw(st.integers(0, len(self.values) - 1))
        obj = self.values[i][0]
        if not np.abs(self.values[i][1].value if isinstance(self.values[i][1], Op)
                      else np.asarray(getattr(self.values[i][1], "value", self.values[i][1]))).max() <= 2:
            return                # exp(x)^2 of a float32 x beyond 2 amplifies its rounding past the tolerance
        try:
            x = ad.Tensor(obj, dtype=np.float32) if isinstance(obj, ad.Tensor) else np.asarray(obj, np.float32)
            shape = np.shape(getattr(obj, "data", obj))
            y, z = self.exp_and_square(np.zeros(shape, np.float32), np.zeros(shape, np.float32), x)
        except KinaTypeError as exc:
            assert "which has finished" in str(exc) and self.involves_finished(i), exc
            return
        recorded_by = self.recorders([i])
        cast = Op("cast32", [self.values[i][1]], recorded_by)
        for name, out in (("exp", y), ("exp_square", z)):
            expr = Op(name, [cast], recorded_by)
            got = out.data if isinstance(out, ad.Tensor) else out
            np.testing.assert_allclose(np.asarray(got, np.float64), expr.value, rtol=self.VALUE_RTOL,
                                       atol=self.VALUE_ATOL)
            expr.value = np.asarray(got, np.float64)        # REBASE
            assert traced(out) == bool(recorded_by), (out, recorded_by)
            self.values.append((out, expr, self.owner(out), recorded_by))


CompiledNesting.TestCase.settings = settings(
    max_examples=300 if CI else 25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_tape_nesting_with_compiled_code(tmp_path):
    so = build_fixture_library(FIXTURE, tmp_path / "fixture.so")
    CompiledNesting.exp_and_square = compiled.load(str(so), f"int32_t exp_and_square({M}, {M}, {M});") \
        .function("exp_and_square", outputs=2)
    CompiledNesting.TestCase("runTest").runTest()
