# The two entry points the README promises: `make demo` and `make test`.
# Each creates .venv (with the interpreter named by PYTHON) and installs kina_fx into it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kina_fx-installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml setup.py $(wildcard kina_fx/_native/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,demo]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kina-fx demo

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benches/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info kina_fx/libkina_fx.so kina_fx/include
