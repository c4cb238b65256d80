# The two set-up commands: `make demo` and `make test`. Each creates .venv when
# it is missing and installs the project into it (editable, with the dev extra).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all bench lint clean install docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -e '.[dev,distributed,docs]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/robustgrad demo

# the default suite on pytest-xdist workers, one per logical CPU (at most 4: each holds TensorFlow and
# its session fixtures), a test file's tests on one worker (--dist loadfile: module fixtures
# are built once); TEST_WORKERS=0 runs it in this one process
TEST_WORKERS ?= logical
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

# ruff, the layering contracts of pyproject.toml [tool.importlinter] (import-linter), then the
# type checker over robustgrad/, attacks/ and agents/ ([tool.mypy])
lint: $(STAMP)
	$(BIN)/ruff check robustgrad attacks agents tests benchmarks examples docs/_ext
	$(BIN)/lint-imports
	$(BIN)/mypy

# the documentation site, offline, warnings as errors (mkdocs.yml; output in build/site)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info
