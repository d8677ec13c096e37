# vllm-fleet: one command to set up and run the main job, one to run every test.
#   make run         set up .venv and run site.yml on inventories/local (this machine)
#   make test        everything CI runs: ruff, mypy, ansible-lint, pytest (unit + integration)
#   make test-unit   the fast loop
#   make bench       accuracy against real vLLM logs and planner speed
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INVENTORY ?= inventories/local
STAMP := $(VENV)/.installed

.PHONY: setup run plan test test-unit lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/ansible-playbook site.yml -i $(INVENTORY)

plan: run

lint: $(STAMP)
	$(BIN)/ruff check vllm_fleet tests plugins
	$(BIN)/ruff format --check vllm_fleet tests plugins
	$(BIN)/mypy
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-lint

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

test: lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -v --durations=5

bench: $(STAMP)
	$(BIN)/python tests/bench/memory_accuracy.py
	$(BIN)/python tests/bench/plan_speed.py

clean:
	rm -rf $(VENV) artifacts .mypy_cache .ruff_cache .pytest_cache
