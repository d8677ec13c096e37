# vllm-fleet: one command to set up and run the main job, one to run every test.
#   make run         set up .venv and run site.yml on inventories/local (this machine)
#   make test        everything CI runs, with a timing table: lint, unit + integration
#                    tests, then the test hosts (images, Docker Engine, Molecule
#                    scenarios, site.yml on the hosts) and their teardown
#   make test-unit   the fast loop (planner unit tests)
#   make check       lint + unit + integration, no test hosts
#   make test-hosts  only the host stage of `make test`
#   make test-extended  the extended checks make test leaves out (docs/testing.md "CI time"): the system
#                    tests marked extended (test_multinode), the harness self-test
#   make test-containers  site.yml with the container runtime on hosts that run their own Docker Engine
#                    (the stand-in serving image, built once per machine; about 30 min fresh)
#   make up / down   start test hosts (and the Docker Engine) and keep them / remove them
#   make ssh NODE=node2   log into a test host
#   make bench       accuracy against real vLLM logs and planner speed
#   make bench-perf  the performance model against public vLLM benchmark results: throughput, TTFT, TPOT
#                    errors and whether the chosen layout is the measured winner (seconds, no host)
#   make bench-serve time to a verified completion of the local default, gateway overhead
#   make bench-day2  rolling update, hung replica and scrape figures on the test hosts (about 10 min)
#   make bench-routing  what the gateway (one model, and routing by model with njs) adds per request
#   make bench-prefix   prefix-cache hit rate and TTFT: nginx least_conn, vllm-router cache_aware and consistent_hash,
#                    3 repetitions each (about 3 min once the vLLM venv and the router venv exist); then what a
#                    prefix-cache hit saves in TTFT on a 19 M-parameter model, measured and predicted (about 70 s)
#   make bench-distribute  the serving image and a 2 GiB model to 3 hosts: through the controller against the
#                    cluster's registry and the node-to-node fan-out, beside the disk's write bandwidth (about 15 min)
#   make bench-scale the plan phase at 32, 128, 512 and 1,000 inventory hosts (time, controller RSS) and
#                    one node's record as the cluster grows (about 3 min, no host reached)
#   make bench-rerun a no-change re-run of site.yml against its first run (INVENTORY=..., RESET=1: teardown first),
#                    with the controller's CPU per host and the re-run projected to 1,000 hosts
#   make bench-fanout the controller's memory per fork and CPU per host (gpu_facts over SSH on 60 inventory
#                    names spread over the test hosts, forks 5, 20, 50; needs make up)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INVENTORY ?= inventories/local
NODES ?= 3
NODE ?= node1
STAMP := $(VENV)/.installed
HOSTS := $(BIN)/python -m tests.hosts

.PHONY: setup run plan doctor test test-unit test-oracle check test-hosts test-extended test-containers docs lint up down ssh bench bench-perf bench-serve bench-scale bench-rerun bench-fanout bench-day2 bench-routing bench-prefix bench-distribute collection dist clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ansible-playbook site.yml -i $(INVENTORY)

plan: $(STAMP)
	$(BIN)/ansible-playbook site.yml -i $(INVENTORY) --tags plan

doctor: $(STAMP)
	$(BIN)/vllm-fleet doctor -i $(INVENTORY)

# The README's inventory table, from the declarations (a unit test keeps them equal).
docs: $(STAMP)
	$(BIN)/python -m vllm_fleet.inventory.interface README.md

lint: $(STAMP)
	$(BIN)/ruff check vllm_fleet tests plugins roles
	$(BIN)/ruff format --check vllm_fleet tests plugins roles
	$(BIN)/mypy
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-lint

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

check: lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -v --durations=5

# CI without the extended checks (make test-extended): with them, the project's CI on two
# cores ran past its 90 min (2026-12-03; docs/testing.md "CI time").
test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(HOSTS) ci --nodes $(NODES) --extended without

# The planner against vLLM's own code (tests/oracle): in a venv with vLLM's CPU build, built once from the hosts' wheels.
test-oracle: $(STAMP)
	VLLM_FLEET_ORACLE_PYTHON="$$($(HOSTS) oracle | tail -1)" VLLM_FLEET_ORACLE_REQUIRED=1 $(BIN)/python -m pytest tests/oracle -q

test-hosts: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(HOSTS) ci --hosts-only --nodes $(NODES) --extended without

# The extended checks alone: the system tests marked extended
# and the harness self-test. Run it before a change to those paths lands.
test-extended: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(HOSTS) ci --hosts-only --nodes 3 --extended only

test-containers: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(HOSTS) ci --hosts-only --nodes 3 --only containers

up: $(STAMP)
	$(HOSTS) up --nodes $(NODES)

down: $(STAMP)
	$(HOSTS) down

ssh: $(STAMP)
	$(HOSTS) ssh $(NODE)

bench: $(STAMP)
	$(BIN)/python tests/bench/memory_accuracy.py
	$(BIN)/python tests/bench/plan_speed.py

# The performance model against public vLLM benchmark results (tests/datasets/vllm_perf_public.yaml).
bench-perf: $(STAMP)
	$(BIN)/python tests/bench/perf_accuracy.py

bench-serve: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/serve_local.py

bench-fanout: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/fanout.py

bench-day2: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/day2.py

bench-routing: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/routing_overhead.py

bench-prefix: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/prefix_routing.py
	$(BIN)/python tests/bench/prefix_ttft.py

bench-distribute: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/distribute.py

bench-scale: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/scale.py

# Faults on a live deployment (test hosts, about 60 min): detection, recovery, failed requests, the next run's changes.
bench-faults: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/faults.py $(if $(FAULTS),--faults $(FAULTS))

bench-rerun: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python tests/bench/rerun.py --inventory $(INVENTORY) $(if $(RESET),--reset)

# The roles, playbooks and filters as the Ansible collection vllm_fleet.core (dist/vllm_fleet-core-<version>.tar.gz).
collection: $(STAMP)
	$(BIN)/python -m vllm_fleet.collection build/collection
	$(BIN)/ansible-galaxy collection build build/collection --output-path dist --force

# The Python package (the planner and its CLI) as an sdist and a wheel in dist/.
dist: $(STAMP)
	$(BIN)/python -m build --outdir dist .

clean:
	rm -rf $(VENV) artifacts build dist .mypy_cache .ruff_cache .pytest_cache
