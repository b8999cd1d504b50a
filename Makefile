# The README's two commands:  `make up`  (backend + worker on 127.0.0.1:8000, SQLite under
# ./data)  and  `make test`  (the whole suite, browser tests included).
# Override TORCH_SPEC for your own build, e.g.
#   make up TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test install system-deps lint clean screenshots bench-mlflow

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[worker,postgres,dev]"
	touch $(STAMP)

install: $(STAMP)

# Debian packages the tests need (chromium for the browser tests); only when root.
system-deps:
	@bash scripts/system-deps.sh

up: install
	$(BIN)/ckptlab up

# -n auto: one pytest-xdist worker per core, each taking whole test files (a file's fixtures
# and the browser tests' app are built once per worker); the tests that judge timings beside
# busy loops run alone (tests/conftest.py). The files go out longest first, in the order
# tests/conftest.py collects them (tests/file_seconds.json), not xdist's most-tests-first.
# PYTEST_ARGS="-n 0": all in this one process.
test: install system-deps
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The README's screenshots (docs/screenshots/*.png), from the browser tests; `make test`
# writes its screenshots to a temporary folder instead.
screenshots: install system-deps
	CKPTLAB_SCREENSHOTS=$(CURDIR)/docs/screenshots $(BIN)/python -m pytest -m browser tests/frontend

# MLflow for the ckptlab/MLflow benchmark only (bench/bench_vs_mlflow.py), in its own venv:
# never a ckptlab dependency. Then: $(BIN)/python bench/run_all.py --mlflow-python .bench-mlflow/bin/python
bench-mlflow:
	test -x .bench-mlflow/bin/python || $(PYTHON) -m venv .bench-mlflow
	.bench-mlflow/bin/python -m pip install -q "mlflow==3.17.2"

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) data
