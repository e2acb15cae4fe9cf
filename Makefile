# make demo | make test | make check (lint + typecheck + tests) | make lint (ruff check,
# ruff format --check and the import-linter layers contract) | make typecheck (mypy) |
# make docs (the documentation site into site/, warnings as errors) |
# make smoke (the built wheel, core only and with each extra, in clean virtualenvs)
#
# Every target runs from .venv, which is created on first use and re-synced whenever
# pyproject.toml changes. PYTEST_ARGS is passed to pytest: make test PYTEST_ARGS='-k claim -x'

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test check lint typecheck docs smoke clean

demo: $(STAMP)
	$(BIN)/geneva-drive demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

check: lint typecheck test

# All three run even when one fails, so one pass (and one CI run) shows every problem.
lint: $(STAMP)
	$(BIN)/ruff check src tests examples; checked=$$?; \
	$(BIN)/ruff format --check src tests examples; formatted=$$?; \
	$(BIN)/lint-imports; layered=$$?; \
	test $$checked -eq 0 -a $$formatted -eq 0 -a $$layered -eq 0

typecheck: $(STAMP)
	$(BIN)/mypy

# The documentation site, into site/; a warning (a broken link, a docstring mkdocstrings cannot
# read) fails the build. It fetches nothing from the network. tests/docs/ runs its code.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The built wheel, core only and with each extra, each in a clean virtualenv (about 90 s).
smoke:
	.ci/wheel-smoke

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -e '.[dev]'
	touch $@

clean:
	rm -rf build dist site .pytest_cache .mypy_cache .ruff_cache geneva_drive_demo.db* backfill.db*
