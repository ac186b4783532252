# gpu-health — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PYTEST_FLAGS ?=
# Test workers (pytest-xdist) for `make test`: each starts its own local control plane, and a test file
# runs on one worker (its module fixtures stay shared). Most integration time is waiting on timers, so
# 4 workers on 2 cores take 14-16 min (3: ~17). 5 took 14-16 min but one run of three failed timer-bound
# tests (the cores saturated; docs/local-control-plane.md). TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 4
PARALLEL = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
# Control-plane binaries: $KUBEBUILDER_ASSETS if set, else built once by hack/testbin.sh.
TESTBIN = $(shell hack/testbin.sh)
# make chart: where the package goes, the image digest it pins, the OCI registry it is pushed to.
CHART_DIST ?= dist
IMAGE_DIGEST ?=
CHART_REGISTRY ?=

# bench/ is scripts, not a package: Python puts bench/ on the path of the one it runs (`import common`);
# those that drive a real operator import tests/support's harness, found through this PYTHONPATH (and
# MYPYPATH for `make lint`'s second mypy run over bench/).
BENCH_PATH = PYTHONPATH=tests/support MYPYPATH=tests/support

##@ Quick start

# `make demo KUBECONFIG=FILE` (on the command line, not from the environment, where it is often set
# for other reasons): the demo on that existing cluster; builds kwok alone, not Kubernetes.
DEMO_CLUSTER = $(if $(filter command line,$(origin KUBECONFIG)),$(KUBECONFIG))

.PHONY: demo
demo: venv $(if $(DEMO_CLUSTER),,testbin) ## Run the demo: local control plane (or KUBECONFIG=FILE: your cluster), simulated GPU fleet with faults, the operator reacting
	$(BIN)/gpu-health-sim demo $(if $(DEMO_CLUSTER),--kubeconfig "$(DEMO_CLUSTER)")

.PHONY: demo-up
demo-up: venv testbin ## Like demo, but keep the cluster running and print its KUBECONFIG
	$(BIN)/gpu-health-sim demo --keep

.PHONY: test
test: venv testbin simnvml ## Run every test CI runs: unit, integration, e2e
	KUBEBUILDER_ASSETS="$(TESTBIN)" $(BIN)/pytest $(PARALLEL) $(PYTEST_FLAGS) tests

##@ Development

.PHONY: venv
venv: $(VENV)/.installed ## Create the virtualenv with runtime and dev dependencies

# The version is read at install time: a bump reinstalls (the metadata would say the old one).
$(VENV)/.installed: pyproject.toml api/gpuhealth_api/__init__.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

.PHONY: testbin
testbin: ## Build (once) etcd, kube-apiserver, controller-manager, scheduler, kubectl, kwok and helm from Go modules
	@hack/testbin.sh >/dev/null

.PHONY: simnvml
simnvml: ## Build (once) the simulated NVML library libnvidia-ml.so.1 against NVIDIA's nvml.h (docs/simulated-nvml.md)
	@hack/simnvml.sh >/dev/null

.PHONY: nvml-bindings
nvml-bindings: venv simnvml ## The NVML-path tests with the oldest nvidia-ml-py allowed and the newest on PyPI (VERSIONS="a b" for others)
	hack/nvml-bindings.sh $(VERSIONS)

.PHONY: unit
unit: venv simnvml ## Run unit tests only (no cluster)
	$(BIN)/pytest $(PYTEST_FLAGS) tests/unit tests/test_layout.py

.PHONY: integration
integration: venv testbin simnvml ## Run integration tests (real kube-apiserver + etcd + kwok)
	KUBEBUILDER_ASSETS="$(TESTBIN)" $(BIN)/pytest $(PYTEST_FLAGS) tests/integration

.PHONY: e2e
e2e: venv testbin ## Run end-to-end tests (helm chart, real processes)
	KUBEBUILDER_ASSETS="$(TESTBIN)" $(BIN)/pytest $(PYTEST_FLAGS) tests/e2e

.PHONY: lint
lint: venv ## ruff, mypy, import-linter, helm lint, promtool check rules, actionlint, one version
	$(BIN)/ruff check .
	$(BIN)/ruff format --check api agent operator sim plugin
	$(BIN)/mypy
	$(BENCH_PATH) $(BIN)/mypy bench
	$(BIN)/lint-imports
	$(MAKE) --no-print-directory lint-chart lint-ci release-check

.PHONY: lint-chart
lint-chart: venv testbin ## helm lint every chart values variant; CRD copy not drifted; promtool check rules on the rendered rules
	hack/sync-chart-crds.sh --check
	for f in charts/gpu-health/ci/*-values.yaml charts/gpu-health/platforms/*.yaml; do "$(TESTBIN)/helm" lint --strict charts/gpu-health -f "$$f" || exit 1; done
	$(PY) hack/chart_rules.py --helm "$(TESTBIN)/helm" --check

.PHONY: lint-ci
lint-ci: ## actionlint on .github/workflows (built once from the Go module proxy; CI cannot run here)
	hack/actionlint.sh

.PHONY: fmt
fmt: venv ## Format the code
	$(BIN)/ruff format api agent operator sim plugin tests bench
	$(BIN)/ruff check --fix .

.PHONY: bench
bench: venv testbin ## Run the benchmarks and print their results (see bench/RESULTS.md)
	$(BENCH_PATH) KUBEBUILDER_ASSETS="$(TESTBIN)" $(PY) bench/agent_overhead.py
	$(BENCH_PATH) KUBEBUILDER_ASSETS="$(TESTBIN)" $(PY) bench/operator_latency.py
	$(BENCH_PATH) KUBEBUILDER_ASSETS="$(TESTBIN)" $(PY) bench/fleet_scale.py
	$(BENCH_PATH) $(PY) bench/backtest_quality.py
	$(BENCH_PATH) KUBEBUILDER_ASSETS="$(TESTBIN)" $(PY) bench/operator_scale.py
	$(BENCH_PATH) KUBEBUILDER_ASSETS="$(TESTBIN)" $(PY) bench/repair_time.py
	$(BENCH_PATH) KUBEBUILDER_ASSETS="$(TESTBIN)" $(PY) bench/checks_coverage.py
	$(BENCH_PATH) $(PY) bench/fleet_model.py --largest-minutes 5

.PHONY: bench-quick
bench-quick: venv testbin ## The benchmarks' quick variants (minutes, for development): agent overhead, 300-node operator scale
	$(BENCH_PATH) KUBEBUILDER_ASSETS="$(TESTBIN)" $(PY) bench/agent_overhead.py --quick
	$(BENCH_PATH) KUBEBUILDER_ASSETS="$(TESTBIN)" $(PY) bench/operator_scale.py --quick

##@ Packaging

.PHONY: chart-crds
chart-crds: ## Copy crds/ into the chart (the chart ships an identical copy)
	hack/sync-chart-crds.sh

.PHONY: chart-docs
chart-docs: venv ## Regenerate the values table in docs/chart.md
	$(PY) hack/chart_values_table.py --write

.PHONY: image-check
image-check: ## Without Docker: lint the Dockerfile, build the wheel, install it in a clean venv, start both entry points
	hack/check-image.sh

.PHONY: image
image: ## Build the image gpu-health:VERSION for this machine's arch and check it runs; PLATFORMS=linux/amd64,linux/arm64 for a multi-arch manifest (docs/release.md)
	hack/build-image.sh

.PHONY: chart
chart: testbin ## Package the chart into dist/ (IMAGE_DIGEST=sha256:... pins the image); CHART_REGISTRY=oci://... also pushes it
	HELM="$(TESTBIN)/helm" CHART_DIST="$(CHART_DIST)" IMAGE_DIGEST="$(IMAGE_DIGEST)" CHART_REGISTRY="$(CHART_REGISTRY)" hack/package-chart.sh

.PHONY: release-check
release-check: ## Check that the package, chart, Dockerfile and CHANGELOG agree with the one version
	@$(PYTHON) hack/version.py check

.PHONY: release
release: testbin ## VERSION=X.Y.Z: commit the version, build wheel+sdist, SBOM, multi-arch image, OCI chart; tag (docs/release.md)
	VERSION="$(VERSION)" PY="$(abspath $(PY))" HELM="$(TESTBIN)/helm" hack/release.sh

.PHONY: clean
clean: ## Remove the virtualenv and caches (not the testbin cache)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build dist *.egg-info

##@ Help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z0-9_.-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
