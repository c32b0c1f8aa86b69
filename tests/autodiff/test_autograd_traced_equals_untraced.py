"""Traced = untraced, for every NumPy function with a rule (issue 16).

Generated from the NumPy mapping (``NUMPY_RULES``: every NumPy function or
ufunc that kina_fx differentiates, and the kina_fx function that does it), so
a new entry is covered as soon as it is registered.  For each entry, calls
are drawn from its rule's ``sample`` domain, then rewritten into the other
forms NumPy documents for the same call:

* positional arguments by keyword and keywords by position, as NumPy's
  signature allows (gaps filled with NumPy's defaults);
* an array argument as a (nested) list; a sequence of arrays as a tuple, or
  as one array (the sequence of its rows); an array as a list of its rows,
  each traced (kina_fx's function only: NumPy does not look inside lists);
* an ``axis`` as its negative twin, an int as a 1-tuple, a tuple as a list;
* a ``shape`` with one ``-1``, a tuple as a list, a 1-tuple as an int.

Each form runs through NumPy's own function on Tensors (``np.f(t)``, what
``__array_function__``/``__array_ufunc__`` dispatch) and through the kina_fx
function it maps to, and must give:

* the value NumPy gives on the untraced arguments (1e-10 relative: the same
  function, not a near one -- eigenvectors of another sign are caught);
* a vjp (random cotangent) and a jvp (random tangent) matching central
  differences of NumPy's function (float64);
* where NumPy refuses a form, a refusal too (an exception, not an answer).

The calls come from a generator seeded with each draw's index (``RandomDraw``),
so the run is the same every time and a failure names the draw that
reproduces it.  The sample domains also draw each documented keyword: a
test checks that every parameter a rule shares with its NumPy function is
reached by those draws (that is how ``eigh(UPLO='U')`` is reached), unless
that parameter's non-default values are refused; another that every NumPy
parameter a rule lacks (``out``, ``dtype``, ``where``, ...) is refused at a
non-default value, never dropped.

Default run: 10 calls per entry (about 5,000 forms, some 10 s of CPU);
``CI=true`` draws 60.
"""
import inspect
import os
import warnings

import numpy as np
import pytest
from support.autograd import RandomDraw

from kina_fx import autograd as ad

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: Calls drawn per NumPy function (each in every form).
DRAWS = 60 if CI else 10
EPS = 1e-6

#: Parameters a rule shares with NumPy whose non-default values it refuses
#: (so no sample can draw them), and why.  docs/autograd.md lists each.
REFUSED = {
    ("sort", "order"): "fields of structured arrays",
    ("svd", "hermitian"): "use eigh",
    ("hstack", "dtype"): "cast the result", ("vstack", "dtype"): "cast the result",
    ("pad", "mode"): "mode='constant' only",
}

#: Forms NumPy refuses and kina_fx takes, with their obvious meaning ("*":
#: any function; a label names the forms whose labels start with it).
#: Everywhere else, where NumPy refuses a form, so must kina_fx.
LENIENT = {
    ("*", "axis as a list"): "a list of axes is a tuple of axes (NumPy's reductions "
                             "want a tuple; flip, roll, expand_dims take either)",
    ("numpy.take_along_axis", "argument 0 as a list"): "NumPy's reads arr.ndim: "
                                                       "kina_fx's takes array_like",
}

#: Forms whose NumPy answer is not NumPy's documented function: not compared.
SKIPPED = {
    ("numpy.split", "argument 0 as a list"): "NumPy splits a list at len(list), whatever "
                                             "the axis (np.split([[1, 2]], [], axis=1) "
                                             "drops the 2)",
    ("numpy.array_split", "argument 0 as a list"): "the same",
}

#: Parameters accepted and ignored (the value is the same whatever they are;
#: ``casting`` matters only with the ``dtype`` that is refused).
IGNORED = {("sort", "kind"), ("sort", "stable"), ("einsum", "optimize"), ("reshape", "copy"),
           ("hstack", "casting"), ("vstack", "casting")}


def _qualname(func):
    module = "numpy.linalg." if func in vars(np.linalg).values() else "numpy."
    return module + func.__name__


MAPPING = sorted(((_qualname(f), f, rule) for f, rule in ad.NUMPY_RULES.items()),
                 key=lambda entry: entry[0])
NAMES = [name for name, _, _ in MAPPING]
ENTRY = {name: (func, rule) for name, func, rule in MAPPING}


def sample_of(rule):
    prim = getattr(rule, "primitive", None)
    return prim.sample if prim is not None else getattr(rule, "sample", None)


def numpy_signature(func):
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):       # ufuncs
        return None


# --- calls as trees of arguments, with the float64 arrays as the variables -----------------


def _is_leaf(v):
    return isinstance(v, np.ndarray) and v.dtype == np.float64


class Form:
    """One call: ``fn(*args, **kwargs)``; the float64 arrays among the
    arguments (also inside a list or tuple argument) are its variables."""

    def __init__(self, label, args, kwargs, numpy_entry=True, kina_fx_entry=True):
        self.label, self.args, self.kwargs = label, list(args), dict(kwargs)
        self.numpy_entry = numpy_entry        # False: NumPy cannot see these Tensors
        self.kina_fx_entry = kina_fx_entry    # False: NumPy's parameter names
        self.paths = []
        for key, v in list(enumerate(self.args)) + list(self.kwargs.items()):
            if _is_leaf(v):
                self.paths.append((key, None))
            elif isinstance(v, (list, tuple)):
                self.paths.extend((key, j) for j, x in enumerate(v) if _is_leaf(x))

    def __repr__(self):
        return f"<{self.label}: args={self.args!r} kwargs={self.kwargs!r}>"

    def _slot(self, args, kwargs, key):
        return args if isinstance(key, int) else kwargs

    @property
    def leaves(self):
        out = []
        for key, j in self.paths:
            v = self._slot(self.args, self.kwargs, key)[key]
            out.append(v if j is None else v[j])
        return out

    def call(self, fn, leaves):
        args, kwargs = list(self.args), dict(self.kwargs)
        for (key, j), leaf in zip(self.paths, leaves):
            slot = self._slot(args, kwargs, key)
            if j is None:
                slot[key] = leaf
            else:
                seq = list(slot[key])
                seq[j] = leaf
                slot[key] = type(slot[key])(seq)
        return outputs(fn(*args, **kwargs))


def outputs(res):
    """The results of a call as a flat list of arrays (tuples, lists, named tuples)."""
    if isinstance(res, (list, tuple)):
        return [v for r in res for v in outputs(r)]
    return [res]


def _ndim_of_first_array(args):
    for a in args:
        if isinstance(a, np.ndarray):
            return a.ndim
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], np.ndarray):
            return a[0].ndim
    return 0


AXIS_NAMES = {"axis", "axis1", "axis2", "axes", "source", "destination"}
SHAPE_NAMES = {"shape", "newshape", "reps"}


def _axis_forms(name, v, ndim):
    # (an int ``axes`` is tensordot's count of axes, not an axis)
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and name != "axes":
        if 0 <= v < ndim:
            yield f"{name} negative", int(v) - ndim
        yield f"{name} as a 1-tuple", (int(v),)
    elif isinstance(v, tuple) and all(isinstance(a, (int, np.integer)) for a in v):
        yield f"{name} as a list", list(v)


def _shape_forms(name, v):
    if isinstance(v, tuple) and v and all(isinstance(s, (int, np.integer)) for s in v):
        yield f"{name} as a list", list(v)
        if len(v) == 1:
            yield f"{name} as an int", int(v[0])
        if name != "reps" and -1 not in v:
            k = next((i for i, s in enumerate(v) if s > 0), None)
            if k is not None:
                yield f"{name} with -1", v[:k] + (-1,) + v[k + 1:]


def forms(func, args, kwargs):
    """The drawn call and its rewritings (see the module docstring)."""
    yield Form("as drawn", args, kwargs)
    sig = numpy_signature(func)
    named = {}
    if sig is not None:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            bound = None
        if bound is not None:
            named = dict(bound.arguments)
            yield from _signature_forms(sig, bound)
    ndim = _ndim_of_first_array(args)
    # parameters by name: rewrite them where they were given
    positions = {}
    if sig is not None and named:
        for i, p in enumerate(sig.parameters.values()):
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and i < len(args):
                positions[p.name] = i
    for name, v in list(named.items()) + [(k, v) for k, v in kwargs.items() if k not in named]:
        rewrites = (_axis_forms(name, v, ndim) if name in AXIS_NAMES
                    else _shape_forms(name, v) if name in SHAPE_NAMES else ())
        for label, new in rewrites:
            a, kw = list(args), dict(kwargs)
            if name in positions:
                a[positions[name]] = new
            else:
                kw[name] = new
            yield Form(label, a, kw)
    # arrays as lists, sequences as tuples or arrays, arrays as lists of traced rows
    for i, v in enumerate(args):
        if _is_leaf(v):
            a = list(args)
            a[i] = v.tolist()
            yield Form(f"argument {i} as a {'list' if v.ndim else 'Python float'}", a, kwargs)
            if v.ndim >= 1 and v.shape[0] > 0:
                a[i] = [row for row in v]
                yield Form(f"argument {i} as a list of rows", a, kwargs, numpy_entry=False)
        elif isinstance(v, list) and v and all(_is_leaf(x) for x in v):
            a = list(args)
            a[i] = tuple(v)
            yield Form(f"sequence {i} as a tuple", a, kwargs)
            if len({x.shape for x in v}) == 1:
                a[i] = np.stack(v)
                yield Form(f"sequence {i} as an array", a, kwargs)


def _signature_forms(sig, bound):
    params = list(sig.parameters.values())
    given = bound.arguments
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    # everything that may be a keyword, by keyword
    args, kwargs = [], {}
    for p in params:
        if p.name not in given:
            continue
        v = given[p.name]
        if p.kind is p.VAR_POSITIONAL:
            args.extend(v)
        elif p.kind is p.VAR_KEYWORD:
            kwargs.update(v)
        elif p.kind is p.POSITIONAL_ONLY:
            args.append(v)
        else:
            kwargs[p.name] = v
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return                      # f(*operands, ...): nothing positional to name
    yield Form("by keyword", args, kwargs, kina_fx_entry=False)
    # everything that may be positional, by position (gaps: NumPy's defaults)
    last = max((i for i, p in enumerate(positional) if p.name in given), default=-1)
    if last < 0 or any(p.default is p.empty and p.name not in given
                       for p in positional[:last + 1]):
        return
    args = [given[p.name] if p.name in given else p.default for p in positional[:last + 1]]
    kwargs = {k: v for k, v in given.items() if k not in {p.name for p in positional}}
    for p in params:
        if p.kind is p.VAR_KEYWORD and p.name in kwargs:
            kwargs.update(kwargs.pop(p.name))
    yield Form("by position", args, kwargs, kina_fx_entry=False)


# --- the check ------------------------------------------------------------------------------


def _numpy(func, form, leaves):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [np.asarray(v, np.float64) for v in form.call(func, leaves)]


def _scale(values):
    return max([float(np.max(np.abs(v))) for v in values if np.size(v)] + [1.0])


def _close(actual, expected, rtol, what):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * _scale([expected]),
                               err_msg=what)


def _listed(table, name, form):
    """Whether ``table`` names this form (its label, or the start of it) of
    ``name`` or of any function ("*")."""
    return any(n in ("*", name) and form.label.startswith(label) for n, label in table)


def check_form(name, func, rule, form, rng):
    if _listed(SKIPPED, name, form):
        return
    leaves = form.leaves
    try:
        expected = _numpy(func, form, leaves)
    except Exception:                            # NumPy refuses this form: so must we
        if _listed(LENIENT, name, form):
            return
        for entry, fn in (("numpy", func), ("kina_fx", rule)):
            if not (form.numpy_entry if entry == "numpy" else form.kina_fx_entry):
                continue
            with pytest.raises(Exception):
                ad.vjp(lambda *xs: form.call(fn, [ad.Tensor(x) for x in xs]), *leaves)
        return
    entries = [("kina_fx", rule)] if form.kina_fx_entry else []
    if form.numpy_entry and leaves:
        entries.append(("numpy", func))
    u = [rng.standard_normal(np.shape(v)) for v in expected]
    dirs = [rng.standard_normal(np.shape(x)) for x in leaves]
    if leaves:
        plus = _numpy(func, form, [x + EPS * d for x, d in zip(leaves, dirs)])
        minus = _numpy(func, form, [x - EPS * d for x, d in zip(leaves, dirs)])
        fd = [(p - m) / (2 * EPS) for p, m in zip(plus, minus)]
    for entry, fn in entries:
        what = f"{name} [{form.label}] through {entry}: args={form.args!r} {form.kwargs!r}"

        def f(*xs):
            return form.call(fn, list(xs))
        if not leaves:
            values = [np.asarray(ad.Tensor(v).data) for v in f()]
        else:
            values, vjp_fn = ad.vjp(f, *leaves)
            values = [np.asarray(ad.Tensor(v).data) for v in values]
        assert [v.shape for v in values] == [v.shape for v in expected], what
        for v, e in zip(values, expected):
            _close(v, e, 1e-10, "value of " + what)
        if not leaves:
            continue
        cts = vjp_fn(u)
        lhs = sum(float(np.sum(c * d)) for c, d in zip(cts, dirs))
        rhs = sum(float(np.sum(ui * fi)) for ui, fi in zip(u, fd))
        _close(lhs, rhs, 1e-5 * _scale(dirs), "vjp of " + what)
        _, tangents = ad.jvp(f, tuple(leaves), tuple(dirs))
        for t, fi in zip(tangents, fd):
            _close(np.asarray(ad.Tensor(t).data), fi, 1e-5, "jvp of " + what)


def test_every_numpy_function_with_a_rule_has_a_sample():
    missing = [name for name, _, rule in MAPPING if sample_of(rule) is None]
    assert not missing, f"NumPy functions with a rule but no sample domain: {missing}"
    assert len(MAPPING) >= 90


def drawn_calls(name):
    """The calls of ``name``'s entry both tests below use: ``DRAWS`` calls
    from its sample domain, each from a generator seeded with its index (so
    a failure names the draw that reproduces it)."""
    _, rule = ENTRY[name]
    sample = sample_of(rule)
    for seed in range(DRAWS):
        rng = np.random.default_rng(seed)
        args, kwargs = sample(RandomDraw(rng))
        yield seed, rng, args, kwargs


@pytest.mark.parametrize("name", NAMES)
def test_traced_equals_untraced_in_every_form(name):
    func, rule = ENTRY[name]
    for seed, rng, args, kwargs in drawn_calls(name):
        for form in forms(func, args, kwargs):
            try:
                check_form(name, func, rule, form, rng)
            except BaseException as e:
                raise AssertionError(f"{name}, draw {seed}, form {form!r}: "
                                     f"{type(e).__name__}: {e}") from e


@pytest.mark.parametrize("name", NAMES)
def test_the_sample_draws_every_parameter_the_rule_shares_with_numpy(name):
    func, rule = ENTRY[name]
    nsig = numpy_signature(func)
    if nsig is None:
        return                                    # a ufunc: arrays only
    rule_name = rule.__name__
    shared = [p.name for p in inspect.signature(rule).parameters.values()
              if p.name in nsig.parameters and p.default is not p.empty
              and (rule_name, p.name) not in REFUSED and (rule_name, p.name) not in IGNORED]
    drawn = set()
    for _, _, args, kwargs in drawn_calls(name):
        try:
            bound = nsig.bind(*args, **kwargs)
        except TypeError:
            continue
        drawn.update(bound.arguments)
        for p in nsig.parameters.values():
            if p.kind is p.VAR_KEYWORD and p.name in bound.arguments:
                drawn.update(bound.arguments[p.name])
    never = sorted(set(shared) - drawn)
    assert not never, (f"{name}: the sample of kina_fx.autograd.{rule_name} never draws "
                       f"{never}, so no test reaches those forms")


class _Unsupported:
    """A value no rule understands."""

    def __repr__(self):
        return "<unsupported value>"


@pytest.mark.parametrize("name", NAMES)
def test_numpy_parameters_the_rule_lacks_are_refused_not_dropped(name):
    """A NumPy parameter the rule does not take (``out``, ``dtype``,
    ``initial``, ``where``, ...) is refused at any value but its default:
    never silently ignored (the binder of kina_fx.autograd.numpy_protocol)."""
    func, rule = ENTRY[name]
    nsig = numpy_signature(func)
    rule_params = inspect.signature(rule).parameters
    if nsig is None:
        extra = ["out", "dtype", "where", "casting", "order", "subok", "signature"]
    else:
        extra = [p.name for p in nsig.parameters.values()
                 if p.kind is p.KEYWORD_ONLY and p.name not in rule_params
                 or p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty
                 and p.name not in rule_params]
    _, _, args, kwargs = next(drawn_calls(name))
    form = Form("as drawn", args, kwargs)
    leaves = form.leaves
    if not leaves:
        return
    for param in extra:
        def call(*a, **k):
            return func(*a, **k, **{param: _Unsupported()})
        with pytest.raises(TypeError, match=param):
            ad.vjp(lambda *xs: form.call(call, [ad.Tensor(x) for x in xs]), *leaves)
