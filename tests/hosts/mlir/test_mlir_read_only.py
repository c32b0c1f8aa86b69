"""Traced arguments that compiled code only reads, passed without a copy.

* kina_fx.mlir_read_only against ground truth: read_only.mlir's functions use
  their first argument in one way each; the proof must accept the reads, must
  refuse every write (a store, a runtime op's output, a linalg output, a
  copy's target, a written view, a written callee, a loop or branch argument,
  a raw pointer), and a call of a function that compile_mlir proved read-only
  must leave the argument's bytes as they were (run, not read off the text).
* every module of read_only_refused/ (an adversarial review's finds: strings
  that spell structure, quoted symbols, signatures that shift the C
  arguments, interposed and hand-written symbols, nested modules) is run,
  and no argument it writes may be proven read-only;
* kina_fx.compiled: the MLP's parameters (mlir's @mlp_loss reads them only)
  are passed as the Tensor's own arrays, and the gradients are the same bits
  as with the copies; an argument that overlaps another memref argument (the
  same Tensor twice, a constant over a parameter's memory) is copied after
  all, and its gradient is still right.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kina_fx import autograd as ad
from kina_fx import compiled, memref, mlir_read_only

from mlir_tools import TOOLS, run, skip_unless_tools

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
RANKED = "kina_memref_descriptor_t *"


@pytest.fixture(scope="module")
def uses(tmp_path_factory):
    skip_unless_tools()
    tmp = tmp_path_factory.mktemp("read_only")
    names = sorted(re.findall(r"func\.func @([rwn]_\w+)", (HERE / "read_only.mlir").read_text()))
    so = compiled.compile_mlir(str(HERE / "read_only.mlir"), str(tmp / "read_only.so"))
    declarations = "".join(f"int32_t _mlir_ciface_{n}({RANKED}, {RANKED});\n" for n in names)
    return names, compiled.load(so, declarations)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    skip_unless_tools()
    so = compiled.compile_mlir(compiled.example_path("mlp.mlir"),
                               str(tmp_path_factory.mktemp("mlp") / "mlp.so"))
    from kina_fx.demos.compiled import DECLARATION
    unranked = "kina_unranked_memref_t *"
    return compiled.load(so, DECLARATION + f"int32_t _mlir_ciface_scale_in_place({unranked}, {unranked}, "
                                           f"{unranked});")


def test_each_use_gets_its_verdict_and_a_proven_argument_is_never_written(uses):
    names, module = uses
    assert {n[0] for n in names} == {"r", "w", "n"} and len(names) == 24
    assert module.read_only["_mlir_ciface_w_store"] == {1}     # the other argument, only read
    for name in names:
        read_only = 0 in module.read_only.get(f"_mlir_ciface_{name}", ())
        assert read_only == name.startswith("r_"), name
        a = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
        before = a.copy()
        module.function(f"_mlir_ciface_{name}")(a, np.zeros(4, np.float32))
        # the ground truth: w_* write a, the others leave it
        assert (not np.array_equal(a.view(np.uint32), before.view(np.uint32))) == name.startswith("w_"), name


#: read_only_refused/<file>.mlir -> (its function, the C return type, its number of memref
#: parameters); None: no verdict at all
REFUSED = {"a_float_shift": ("f", "int32_t", 2), "b_symname2": ("g", "int32_t", 2),
           "c_callee": ("f", "int32_t", 2), "d_linalg_doc": ("f", "int32_t", 2),
           "e_header": ("f", "int32_t", 2), "f_interpose2": ("f", "int32_t", 2),
           "f_strlen": ("f", "int32_t", 2), "g_depth": ("f", "void", 2), "h_result_shift": None,
           "m_ciface_spoof": ("x", "int32_t", 2), "m2": ("x", "int32_t", 2), "n_nested": ("g", "int32_t", 2),
           "o_colon": None, "avail_externally_libc": ("f", "int32_t", 1),
           "libcall_sinf": ("f", "int32_t", 1), "indirect_cast": ("f", "int32_t", 1),
           # declared as a C host would, without the vector no C declaration can spell
           "w_vector_param": ("f", "int32_t", 2)}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_no_argument_a_module_writes_is_proven_read_only(case, tmp_path):
    skip_unless_tools()
    so = compiled.compile_mlir(str(HERE / "read_only_refused" / f"{case}.mlir"), str(tmp_path / "m.so"))
    if REFUSED[case] is None:
        assert compiled.load(so, "").read_only == {}
        return
    fn, returns, n = REFUSED[case]
    module = compiled.load(so, f"{returns} _mlir_ciface_{fn}({', '.join([RANKED] * n)});")
    function = module.function(f"_mlir_ciface_{fn}")
    # every byte differs from its neighbours (1.0's low bytes are zero, and hide a byte swap)
    args = [np.arange(8, dtype=np.float32) * 1.1 + 1.3 + k for k in range(n)]
    before = [a.copy() for a in args]
    function(*args)
    written = {k for k, (a, b) in enumerate(zip(args, before)) if a.tobytes() != b.tobytes()}
    assert written, "the case no longer writes its argument: it tests nothing"
    assert not written & function._read_only
    assert not written & module.read_only.get(f"_mlir_ciface_{fn}", frozenset())


@pytest.mark.parametrize("case", ["libcall_sinf_plain", "indirect_cast_plain"])
def test_a_function_that_runs_what_is_not_plain_gets_no_verdict(case):
    skip_unless_tools()
    generic = run([TOOLS["mlir-opt-19"], "--mlir-print-op-generic",
                   HERE / "read_only_refused" / f"{case}.mlir"]).stdout
    assert "_mlir_ciface_f" not in mlir_read_only.read_only_arguments(generic)


def test_a_shared_object_not_built_by_compile_mlir_claims_nothing(tmp_path):
    from support.abi import build_fixture_library

    so = build_fixture_library(HERE.parent / "c" / "compiled_fixture.c", tmp_path / "fixture.so")
    module = compiled.load(str(so), "int32_t double_by_hand(kina_unranked_memref_t *, kina_unranked_memref_t *);")
    assert module.read_only == {}
    assert module.function("double_by_hand", outputs=1)._read_only == frozenset()


def test_the_verdicts_survive_their_encoding():
    verdicts = {"_mlir_ciface_f": (4, (1, 3)), "_mlir_ciface_g": (0, ()), "_mlir_ciface_h.$x": (1, (0,))}
    assert mlir_read_only.decode(mlir_read_only.encode(verdicts)) == {
        k: (n, frozenset(v)) for k, (n, v) in verdicts.items()}


def test_a_declaration_of_another_number_of_parameters_takes_no_verdict(mlp):
    module = compiled.load(mlp.path, f"int32_t _mlir_ciface_mlp_loss({', '.join([RANKED] * 6)});")
    assert module.read_only["_mlir_ciface_mlp_loss"] == frozenset({1, 2, 3, 4, 5, 6})
    assert module.function("_mlir_ciface_mlp_loss", outputs=1)._read_only == frozenset()


@settings(deadline=None, max_examples=60, derandomize=True)
@given(shape=st.lists(st.integers(0, 4), min_size=0, max_size=3), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([np.float32, np.float64, np.int64, np.float16]))
def test_byte_span_is_numpys_byte_bounds(shape, seed, dtype):
    rng = np.random.default_rng(seed)
    base = np.zeros([s * 2 + 1 for s in shape], dtype)
    view = base[tuple(slice(None, None, int(rng.choice([-2, -1, 1, 2]))) for _ in shape)] if shape else base
    view = view[tuple(slice(0, s) for s in shape)] if shape else view
    byte_bounds = getattr(np.lib, "array_utils", np).byte_bounds     # NumPy 2, NumPy 1
    low, high = byte_bounds(view)
    expected = (0, 0) if view.size == 0 else (low, high)
    assert memref.byte_span(memref.identity(view)) == expected


def _mlp_problem(n=6, d=5, h=4, c=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, c, n),
            rng.standard_normal((d, h)).astype(np.float32), rng.standard_normal(h).astype(np.float32),
            rng.standard_normal((h, c)).astype(np.float32), rng.standard_normal(c).astype(np.float32))


def _step(fn):
    def loss(w1, b1, w2, b2, x, y):
        return fn(np.zeros((), np.float32), x, y, w1, b1, w2, b2)
    return ad.value_and_grad(loss, argnums=(0, 1, 2, 3))


def test_the_mlps_parameters_are_proven_read_only_and_passed_as_they_are(mlp):
    assert mlp.read_only["_mlir_ciface_mlp_loss"] == frozenset({1, 2, 3, 4, 5, 6})
    assert mlp.read_only["_mlir_ciface_scale_in_place"] == frozenset({2})     # writes its x
    fn = mlp.function("_mlir_ciface_mlp_loss", outputs=1)
    copies, spare_copy = [], fn._spare_copy
    fn._spare_copy = lambda a: copies.append(a.shape) or spare_copy(a)
    x, y, w1, b1, w2, b2 = _mlp_problem(d=128, h=160)     # w1: 80 KB
    assert w1.nbytes >= compiled.AS_IS_BYTES > b1.nbytes + w2.nbytes + b2.nbytes
    before = [p.copy() for p in (w1, b1, w2, b2)]
    for _ in range(2):
        _step(fn)(w1, b1, w2, b2, x, y)
        assert copies == [b1.shape, w2.shape, b2.shape]  # the small ones only
        copies.clear()
    for p, b in zip((w1, b1, w2, b2), before):
        np.testing.assert_array_equal(p, b)


@settings(deadline=None, max_examples=25, derandomize=True)
@given(n=st.integers(1, 9), d=st.integers(1, 6), h=st.integers(1, 6), c=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_passed_as_is_the_gradients_are_the_copies_bits(mlp, n, d, h, c, seed):
    as_is = mlp.function("_mlir_ciface_mlp_loss", outputs=1)
    copied = mlp.function("_mlir_ciface_mlp_loss", outputs=1)
    copied._read_only = frozenset()         # every traced argument copied, as before the proof
    x, y, w1, b1, w2, b2 = _mlp_problem(n, d, h, c, seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled, "AS_IS_BYTES", 0)      # as they are at any size
        (l1, g1), (l2, g2) = (_step(f)(w1, b1, w2, b2, x, y) for f in (as_is, copied))
    assert np.asarray(l1).tobytes() == np.asarray(l2).tobytes()
    for a, b in zip(g1, g2):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    python = ad.value_and_grad(lambda w1, b1, w2, b2: ad.cross_entropy(
        ad.relu(x @ w1 + b1) @ w2 + b2, y), argnums=(0, 1, 2, 3))
    lp, gp = python(w1, b1, w2, b2)
    np.testing.assert_allclose(l1, lp, rtol=1e-5)
    for a, b in zip(g1, gp):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.fixture
def mlp_loss_as_is(mlp, monkeypatch):
    """@mlp_loss, its traced arguments passed as they are at any size."""
    monkeypatch.setattr(compiled, "AS_IS_BYTES", 0)
    return mlp.function("_mlir_ciface_mlp_loss", outputs=1)


def test_two_tensors_over_one_memory_are_copied_and_get_their_own_gradients(mlp_loss_as_is):
    fn = mlp_loss_as_is
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.integers(0, 4, 6)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    b = np.zeros(4, np.float32)

    def compiled_loss(w1, w2):
        return fn(np.zeros((), np.float32), x, y, w1, b, w2, b)

    def python_loss(w1, w2):
        return ad.cross_entropy(ad.relu(x @ w1 + b) @ w2 + b, y)

    for second in (w, w[:]):                # the same array, another array over its memory
        got = ad.grad(compiled_loss, argnums=(0, 1))(w, second)
        for a, e in zip(got, ad.grad(python_loss, argnums=(0, 1))(w, w.copy())):
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-6)
    assert fn._snapshots                    # copies, for both uses


def test_a_constant_over_a_parameters_memory_has_the_parameter_copied(mlp_loss_as_is):
    fn = mlp_loss_as_is
    rng = np.random.default_rng(6)
    w1 = rng.standard_normal((4, 4)).astype(np.float32)
    y = rng.integers(0, 3, 4)
    b1, w2, b2 = np.zeros(4, np.float32), rng.standard_normal((4, 3)).astype(np.float32), np.zeros(3, np.float32)

    def compiled_loss(w1):
        return fn(np.zeros((), np.float32), w1_memory, y, w1, b1, w2, b2)

    w1_memory = w1      # x is the parameter's own array, passed as a plain constant
    expected = ad.grad(lambda w: ad.cross_entropy(ad.relu(w1.copy() @ w + b1) @ w2 + b2, y))(w1)
    np.testing.assert_allclose(ad.grad(compiled_loss)(w1), expected, rtol=1e-4, atol=1e-6)
    assert fn._snapshots


def test_an_argument_the_code_writes_is_still_copied(mlp):
    fn = mlp.function("_mlir_ciface_scale_in_place", outputs=1)
    x = np.array([1.0, -2.0, 3.0], np.float32)
    w = np.array([0.5, 4.0, -1.0], np.float32)
    (gx, gw) = ad.grad(lambda x, w: fn(np.zeros((), np.float32), x, w), argnums=(0, 1))(x, w)
    np.testing.assert_array_equal(gx, w)        # loss = sum(x * w), then x updated in place
    np.testing.assert_array_equal(gw, x)
    np.testing.assert_array_equal(x, [1.0, -2.0, 3.0])


def test_jvp_through_arguments_passed_as_they_are(mlp_loss_as_is):
    fn = mlp_loss_as_is
    x, y, w1, b1, w2, b2 = _mlp_problem(seed=3)
    t = np.random.default_rng(4).standard_normal(w1.shape).astype(np.float32)
    _, compiled_t = ad.jvp(lambda w: fn(np.zeros((), np.float32), x, y, w, b1, w2, b2), (w1,), (t,))
    _, python_t = ad.jvp(lambda w: ad.cross_entropy(ad.relu(x @ w + b1) @ w2 + b2, y), (w1,), (t,))
    np.testing.assert_allclose(compiled_t, python_t, rtol=1e-4, atol=1e-6)


def test_a_line_the_reading_does_not_account_for_proves_nothing():
    skip_unless_tools()
    generic = run([TOOLS["mlir-opt-19"], "--mlir-print-op-generic", compiled.example_path("mlp.mlir")]).stdout
    assert mlir_read_only.read_only_arguments(generic)["_mlir_ciface_mlp_loss"] == (7, (1, 2, 3, 4, 5, 6))
    lines = generic.splitlines()
    body = next(k for k, line in enumerate(lines) if '"func.call"' in line)
    for odd in ('    memref.store %a, %b[%c] : memref<?xf32>',     # custom form: not read as an op
                '  %x = "memref.load"(%y) : (memref<f32>) -> f32'):     # outside every function
        where = body if odd.startswith("    ") else len(lines) - 1
        assert mlir_read_only.read_only_arguments("\n".join(lines[:where] + [odd] + lines[where:])) == {}


@settings(deadline=None, max_examples=200, derandomize=True)
@given(layout=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12), st.sampled_from([1, -1, 2, 0]),
                                 st.booleans()), min_size=1, max_size=7))
def test_the_overlap_check_is_every_pair_compared(layout):
    # (first element's index, length, stride, passed as it is) of float32 vectors in one address range
    base, item = 4096, 4
    passed, spans = {}, {}
    for i, (first, n, stride, as_is) in enumerate(layout):
        key = (base + first * item if n else 0, (n,), (0 if n == 1 else stride,), "<f4")
        array = object()
        passed[i] = (array, (None, None, None, None, None, key), object(), array if as_is else object())
        spans[i] = memref.byte_span(key)
    expected = sorted(i for i in passed if passed[i][0] is passed[i][3] and any(
        j != i and spans[i][0] < spans[j][1] and spans[j][0] < spans[i][1] for j in passed))
    assert sorted(compiled.CompiledFunction._overlapping(None, passed)) == expected
