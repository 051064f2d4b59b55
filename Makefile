# The two commands: `make test` and `make demo`. Both set up everything they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BERTH  := $(VENV)/bin/berth

.PHONY: test demo setup binaries lint unit e2e crds chart-docs clean bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed

binaries: setup
	$(BERTH) dev build

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q tests/unit

e2e: binaries
	$(PY) -m pytest -q tests/e2e

test: binaries lint
	$(PY) -m pytest -q tests

demo: binaries
	$(BERTH) dev down
	$(BERTH) dev up --nodes 3 --node-cpu 4 --node-memory 8Gi --cert-manager
	$(BERTH) dev demo
	@bash scripts/demo-intro.sh

# What Berth costs, measured beside the same cluster without it: writes bench/RESULTS.md.
# BENCH_SCALE=small runs clusters of 50/200/500 nodes (a check of the bench, in minutes).
BENCH_SCALE ?= full
bench: binaries
	$(PY) -m bench.run --scale $(BENCH_SCALE)

# The chart's crds/ holds the same files, without the kustomization that lists them.
crds: setup
	$(BERTH) crds --out manifests/crds
	cp manifests/crds/scheduling.koordinator.sh_*.yaml charts/berth/crds/

# The values table of charts/berth/README.md, from the comments of values.yaml.
chart-docs: setup
	$(PY) -m devtools.chart

clean:
	-$(BERTH) dev down
	rm -rf $(VENV)
