# localcache — one target per job. Python comes from the project's virtualenv (.venv).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help venv lint typecheck test-unit test-integration test bench manifests run \
        control-plane deploy undeploy clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(PY): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(PY)

venv: $(PY) ## create .venv and install localcache with its dev extra

control-plane: ## build (or reuse) etcd, kube-apiserver, kube-controller-manager from source
	@bash hack/build-control-plane.sh >/dev/null

lint: $(PY) ## ruff
	$(VENV)/bin/ruff check localcache tests benchmarks
	$(VENV)/bin/ruff format --check localcache tests benchmarks

typecheck: $(PY) ## mypy --strict
	$(VENV)/bin/mypy

test-unit: $(PY) ## fast unit tests, no network
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: $(PY) control-plane ## integration tests on the real control plane
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test: $(PY) control-plane ## the whole suite: lint, types, unit, integration, e2e
	$(MAKE) lint typecheck
	$(PY) -m pytest tests $(PYTEST_ARGS)

bench: $(PY) control-plane ## benchmarks, each printed beside its baseline
	$(PY) -m benchmarks

manifests: $(PY) ## regenerate manifests/crds from the pydantic models
	$(PY) -m localcache.api.crdgen manifests/crds

run: $(PY) control-plane ## the operator against the current kubeconfig, or a local control plane
	$(VENV)/bin/localcache run

deploy: ## install into a kind cluster (needs Docker + kind)
	@echo "make deploy needs Docker and kind" >&2; exit 2

undeploy: ## remove from the kind cluster
	@echo "make undeploy needs Docker and kind" >&2; exit 2

clean: ## remove build output
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
