# make demo | make test | make check (lint + typecheck + tests) | make lint (ruff check and
# ruff format --check) | make typecheck (mypy)
#
# Every target runs from .venv, which is created on first use and re-synced whenever
# pyproject.toml changes. PYTEST_ARGS is passed to pytest: make test PYTEST_ARGS='-k claim -x'

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test check lint typecheck clean

demo: $(STAMP)
	$(BIN)/geneva-drive demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

check: lint typecheck test

# Both run even when the first fails, so one pass (and one CI run) shows every problem.
lint: $(STAMP)
	$(BIN)/ruff check src tests; checked=$$?; \
	$(BIN)/ruff format --check src tests && exit $$checked

typecheck: $(STAMP)
	$(BIN)/mypy

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -e '.[dev]'
	touch $@

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache geneva_drive_demo.db*
