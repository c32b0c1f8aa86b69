# The two entry points the README promises: `make demo` and `make test`.
# Each creates .venv (with the interpreter named by PYTHON) and installs kina_fx into it.
# CI (.ci/run) runs `make test PYTHON=... VENV=.venv-3.X` once per CPython version.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kina_fx-installed
DEV_STAMP := $(VENV)/.kina_fx-dev-installed

# The source tree holds one editable build (kina_fx/libkina_fx.so and friends,
# tied to one CPython minor version); it belongs to the venv that installed it
# last, named in OWNER.  Using another venv reinstalls, which rebuilds it.
OWNER := kina_fx/.editable-owner
ifneq ($(shell cat $(OWNER) 2>/dev/null),$(abspath $(VENV)))
$(STAMP) $(DEV_STAMP): FORCE
endif

.PHONY: demo test bench typecheck docs clean FORCE

$(STAMP): pyproject.toml setup.py $(wildcard kina_fx/ffi/c/* kina_fx/_speedups_c/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,demo,mpi]'
	echo $(abspath $(VENV)) > $(OWNER)
	touch $(STAMP)

# The type checkers and the documentation build: the extras of `make test` and two more.
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,demo,mpi,typing,docs]'
	echo $(abspath $(VENV)) > $(OWNER)
	touch $(DEV_STAMP)

demo: $(STAMP)
	$(VENV)/bin/kina-fx demo

# The whole suite; tests/effects, tests/abi, tests/hosts/c and tests/hosts/ocaml
# on both implementations of the effects runtime (the compiled one here, the
# pure-Python one in a second pytest process beside it:
# tests/support/implementations.py).
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benches/run_all.py

# mypy --strict and pyright on a typed user program (tests/typing) and the typed API.
typecheck: $(DEV_STAMP)
	$(PY) -m mypy --strict tests/typing
	$(VENV)/bin/basedpyright --pythonpath $(PY) --project tests/typing
	KINA_FX_TYPECHECK=1 $(PY) -m pytest -q -p no:cacheprovider tests/package/test_typing.py

# The API reference from the docstrings; any Sphinx warning fails the build.
docs: $(DEV_STAMP)
	$(PY) -m sphinx -W --keep-going -q -b html docs build/docs

clean:
	rm -rf $(VENV) .venv-* build dist *.egg-info kina_fx/include kina_fx/pkgconfig \
	  kina_fx/libkina_fx.so kina_fx/_libkina_fx_cpython.so kina_fx/_speedups.*.so $(OWNER)
