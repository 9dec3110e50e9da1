# localcache — one target per job. Python comes from the project's virtualenv (.venv).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help venv lint typecheck test-unit test-integration test bench bench-dataplane manifests run \
        control-plane helm node images deploy undeploy clean docker-build kind-create kind-load e2e-kind

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(PY): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(PY)

venv: $(PY) ## create .venv and install localcache with its dev extra

control-plane: ## build (or reuse) etcd, kube-apiserver, kube-controller-manager from source
	@bash hack/build-control-plane.sh >/dev/null

node: control-plane ## build (or reuse) kubelet, kube-scheduler, containerd; install runc, CNI plugins
	@bash hack/build-node.sh >/dev/null

helm: ## build (or reuse) helm v3.22.0 from source through the Go module proxy
	@bash hack/build-helm.sh >/dev/null

images: ## build (or reuse) the local images: pause, python base, localcache, storage initializer, KServe's controllers, stand-in runtime
	@bash hack/build-images.sh >/dev/null

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
	$(PY) -m pytest tests -n 2 --durations=15 $(PYTEST_ARGS)

bench: $(PY) control-plane ## benchmarks, each printed beside its baseline
	$(PY) -m benchmarks

BENCH_ARGS ?=
bench-dataplane: $(PY) control-plane ## data plane on its own real-node bed: baseline vs peer (BENCH_ARGS="--size 1G --nodes 1,2,4 --pairs 3")
	$(PY) -m benchmarks.dataplane $(BENCH_ARGS)

manifests: $(PY) ## regenerate manifests/crds, then the install profiles and the Helm chart
	$(PY) -m localcache.api.crdgen manifests/crds
	$(PY) hack/genprofiles.py

run: $(PY) control-plane ## the operator against the current kubeconfig, or a local control plane
	$(VENV)/bin/localcache run

# ---- kind (needs a Docker engine and kind: not available on the CI machines) ----------
KIND ?= kind
KIND_CLUSTER ?= localcache
IMG ?= localcache:dev
KUBECTL_KIND = kubectl --context kind-$(KIND_CLUSTER)

docker-build: ## build the one image (controller + agent)
	docker build -t $(IMG) .

kind-create: ## kind: 1 control plane + 2 workers labelled kserve/localmodel=worker
	mkdir -p /tmp/localcache-kind/worker/models /tmp/localcache-kind/worker2/models
	$(KIND) get clusters | grep -qx $(KIND_CLUSTER) || $(KIND) create cluster --name $(KIND_CLUSTER) --config hack/kind-config.yaml --wait 120s

kind-load: docker-build ## load the image into the kind cluster
	$(KIND) load docker-image $(IMG) --name $(KIND_CLUSTER)

deploy: kind-load ## install into the kind cluster (needs Docker + kind)
	$(KUBECTL_KIND) apply -k manifests/kind
	$(KUBECTL_KIND) -n kserve rollout status deployment/kserve-localmodel-controller-manager --timeout=180s
	$(KUBECTL_KIND) -n kserve rollout status daemonset/kserve-localmodelnode-agent --timeout=180s

undeploy: ## remove from kind (caches first, while the controller can remove finalizers)
	-$(KUBECTL_KIND) delete localmodelnamespacecaches,localmodelcaches --all --all-namespaces --timeout=120s
	$(KUBECTL_KIND) delete -k manifests/kind --ignore-not-found

e2e-kind: deploy ## end-to-end tests against the kind deployment
	$(KIND) get kubeconfig --name $(KIND_CLUSTER) > /tmp/localcache-kind/kubeconfig
	LOCALCACHE_E2E_KUBECONFIG=/tmp/localcache-kind/kubeconfig $(PY) -m pytest tests/e2e $(PYTEST_ARGS)

clean: ## remove build output
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
