# Two commands for a fresh clone (see README.md):
#   make run    install everything into .venv, then run the daemon under ./run/root
#   make test   install everything into .venv, then lint, type-check and run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest schemas protos bench clean

# uv installs in a quarter of pip's time, bytecode compiled as pip does (the machine sets
# PYTHONDONTWRITEBYTECODE: without it every interpreter would compile the packages again);
# pip where uv cannot be had
# testbed/ (the tests' servers, the developers' benches: docs/adr/0014) is a distribution of its
# own, installed beside eventsrc with its test extra and never inside its package
$(STAMP): pyproject.toml testbed/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv \
	  && $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -e '.[test]' -e ./testbed \
	  || $(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]' -e ./testbed
	touch $(STAMP)

run: $(STAMP)
	./scripts/run.sh

# lint and mypy side by side (each uses one core), then the suite on every core
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 lint typecheck
	$(MAKE) --no-print-directory pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/vulture

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Bytecode first: the suite starts an interpreter for every daemon, plugin and CLI call, and
# where PYTHONDONTWRITEBYTECODE is set each would compile eventsrc from source again.
# compileall writes the bytecode whatever that variable says (docs/performance.md).
# Three workers on two cores: many tests wait on subprocesses, servers and syncs, and two
# workers left a third of the CPU idle; worksteal evens out the tail.
pytest: $(STAMP)
	$(PY) -m compileall -q eventsrc testbed tests
	$(PY) -m pytest -n 3 --dist worksteal --durations=25

schemas: $(STAMP)
	$(PY) -m eventsrc.codegen.schema --write

protos: $(STAMP)
	$(PY) -m eventsrc.codegen.protos --write

bench: $(STAMP)
	$(VENV)/bin/eventsrc bench log
	$(VENV)/bin/eventsrc bench devices

clean:
	rm -rf $(VENV) run build *.egg-info
