# slurm_amoeba — the two commands a fresh Debian 12 machine is set up by:
#   make demo   the main job: a local Slurm cluster, an elastic job that grows and shrinks
#   make test   lint, type-check, the docs site and every test (unit, integration and e2e on a real local Slurm cluster)
# Both install what they need themselves (scripts/bootstrap: apt packages, .venv, torch, the package).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test demo bootstrap lint typecheck docs unit cluster-up cluster-down clean

bootstrap:
	scripts/bootstrap

lint: bootstrap
	$(VENV)/bin/ruff check slurm_amoeba tests examples benchmarks scripts/demo
	$(VENV)/bin/ruff format --check slurm_amoeba tests examples benchmarks

typecheck: bootstrap
	$(VENV)/bin/mypy

# the docs site, warnings (a broken link or anchor) as errors; docs/results.md must be what docs/results/ renders
docs: bootstrap
	$(PY) -m benchmarks.render_results --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The tests that need no Slurm (every unit test, and the integration tests not marked slurm) run on two processes
# (pytest-xdist; worksteal: an idle one takes queued tests from the other, so neither waits out the other's last
# slow tests); the Slurm tests then run serially, in one session around one cluster (the slurm_cluster fixture).
# Every test runs: the marker splits tests/ between the two, and the second runs even when the first failed (make
# test fails if either did).
test: bootstrap lint typecheck docs
	$(PY) -m pytest tests -m "not slurm" -n 2 --dist worksteal --durations=25; unit=$$?; \
	$(PY) -m pytest tests -m slurm --durations=25 && exit $$unit

unit: bootstrap
	$(PY) -m pytest tests/unit -n 2 --dist worksteal

demo: bootstrap
	$(PY) scripts/demo

cluster-up: bootstrap
	scripts/slurm-cluster up

cluster-down:
	scripts/slurm-cluster down

clean:
	scripts/slurm-cluster down || true
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
