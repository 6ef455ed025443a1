# htcondor-jobstore developer targets.  Quick start: `make demo`, `make test`.

# The virtualenv is made from the system Python on purpose.  The hooks run as the condor
# service account and as job users, so they must be able to execute the venv's interpreter.
# A venv made from a Python under a private home directory (e.g. /root/.pyenv, mode 700)
# cannot be executed by those accounts: the exec fails and, for FETCH_WORK, the slot never
# fetches again (htcondor-hook-protocol.md 2.9).  Only fall back to `python3` on PATH when
# /usr/bin/python3 does not exist.
PYTHON_FOR_VENV := $(shell if [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else echo python3; fi)

VENV := .venv
PY := $(VENV)/bin/python
# The clone's own .venv links to this clone (an editable install); a venv elsewhere
# (`make demo VENV=/opt/jobstore-venv`, for a clone in a private home) gets a copy of the
# package, which the hooks' accounts can read wherever the clone is.
INSTALL := $(if $(filter .venv,$(VENV)),-e ,)
SOURCES := $(if $(INSTALL),,$(shell find jobstore -type f \( -name '*.py' -o -name '*.sql' -o -name '*.mako' \)))
PYTEST_ARGS ?=
# `make test` runs its tests in this many processes (pytest-xdist): two per CPU, at most 8, as
# many of its tests wait on other processes and on timers. They are handed out at most 8 at a
# time, the system tier first (tests/conftest.py), so no worker sits idle while another still
# has a queue of long tests.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$((2 * n > 8 ? 8 : 2 * n)))

.PHONY: venv bytecode demo test test-slow test-live test-all lint bench docs

venv: $(VENV)/.installed

# Re-runs only when pyproject.toml changes (or the venv is missing).
$(VENV)/.installed: pyproject.toml $(SOURCES)
	$(PYTHON_FOR_VENV) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(INSTALL)'.[test]'
	touch $@

demo: venv
	$(VENV)/bin/jobstore demo

# `make test`: everything but the long scale, concurrency, fault and emulated-node runs (marked
# `slow`) and the rest of the backend and mode matrix (`matrix`: a test that takes db_url runs
# on SQLite here), in parallel, with few examples per Hypothesis test; `make test-slow` runs the
# slow ones one at a time (they measure and load the machine themselves) and the Hypothesis
# tests again with the examples each asks for (tests/support/examples.py), then the matrix in
# parallel. CI (.ci/run) runs both, one after the other.
# Every process the tests start imports the package: compiled once here, not in each of them
# (with PYTHONDONTWRITEBYTECODE set, no process would write it); so are the test modules as
# pytest rewrites their asserts, which each pytest-xdist worker would otherwise do again.
bytecode: venv
	$(PY) -m compileall -q jobstore tests bench
	env -u PYTHONDONTWRITEBYTECODE -u JOBSTORE_PYTEST_STATUS_FILE $(PY) -m pytest -q \
		-p no:cacheprovider --collect-only tests > /dev/null

test: venv bytecode
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not matrix and not live" \
		-n $(TEST_WORKERS) --maxschedchunk=8 --durations=15 $(PYTEST_ARGS)

test-slow: venv bytecode
	JOBSTORE_TEST_EXAMPLES=large $(PY) -m pytest -q -p no:cacheprovider \
		-m "(slow or hypothesis) and not live" --durations=15 $(PYTEST_ARGS)
	$(PY) -m pytest -q -p no:cacheprovider -m "matrix and not slow and not hypothesis and not live" \
		-n $(TEST_WORKERS) --maxschedchunk=8 --durations=15 $(PYTEST_ARGS)

# `make test-live`: tests/live on a personal pool of a real HTCondor (HTCONDOR_PREFIX, else
# condor_master on PATH; skipped with one line otherwise), as root.
test-live: venv bytecode
	$(PY) -m pytest -q -p no:cacheprovider -m live --durations=15 $(PYTEST_ARGS) tests/live

test-all: test test-slow

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: venv
	$(PY) bench/run.py

# `make docs`: the pages rendered from the code (docs/settings.md from node/settingtable.py).
docs: venv
	$(PY) -m jobstore.node.settingspage > docs/settings.md.new && mv docs/settings.md.new docs/settings.md
