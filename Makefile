# The README's two commands are `make demo` and `make test`; everything they need is
# installed and started from here.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
# CrewAI pins mcp<2, openai<3 and pydantic<2.13: its adapter's tests run in their own venv.
CREWAI_VENV ?= .venv-crewai
PY := $(CURDIR)/$(VENV)/bin/python
# The benchmarks and hack/ scripts import the test fixtures (tests/fixtures: the package
# `fixtures`, as pytest imports it: pyproject's pythonpath) to start the same real parts.
FIXTURES_ENV = PYTHONPATH=$(CURDIR)/tests$${PYTHONPATH:+:$$PYTHONPATH}
RUN := $(FIXTURES_ENV) $(PY)
PYTEST_ARGS ?=
# Compiled modules are cached (__pycache__/, ignored by git): the suite starts hundreds of
# Python processes, and with PYTHONDONTWRITEBYTECODE set each would compile the runtime
# again (~0.3 s apiece).
unexport PYTHONDONTWRITEBYTECODE
# Parallel pytest workers for `make test` (each with its own servers; see tests/conftest.py).
TEST_WORKERS ?= 2

.PHONY: chart-lint chart-test demo demo-docs demo-cluster test test-deps test-redis-cluster install crewai-venv mcp-servers unit lint typecheck bench bench-fleet bench-node clean crds monitoring system-deps control-plane stripe-mock promtool node cluster cluster-down dev-cluster dev-cluster-down

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

$(CREWAI_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CREWAI_VENV)
	$(CREWAI_VENV)/bin/python -m pip install -q --upgrade pip
	$(CREWAI_VENV)/bin/python -m pip install -q -e '.[crewai]' 'pytest>=8' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3'
	touch $@

install: $(VENV)/.installed

# CrewAI's own environment, for its adapter's tests (`make test`, `make unit`).
crewai-venv: $(CREWAI_VENV)/.installed

demo: install
	$(PY) examples/multi_domain.py
	$(PY) examples/chaos_demo.py
	$(PY) examples/crash_recovery.py
	$(PY) examples/kill_switch.py
	$(PY) examples/small_model_big_docs.py

# A 2k-token host answers questions over a 440k-character document through the
# ContextBroker's tiers, driven by an AgentLoop; every answer traced to its receipts.
demo-docs: install
	$(PY) examples/small_model_big_docs.py

# The whole system for a person, offline: local control plane, Redis, the operator, two
# recoveryd replicas and a small agent fleet; narrated (budget, kill switch, kill -9).
demo-cluster: install system-deps control-plane
	@$(RUN) hack/demo_cluster.py

# Everything: unit, integration (real Redis + PostgreSQL), e2e (real kube-apiserver +
# etcd) and node (a real single-node cluster running the chart's pods) suites. The first
# run builds the control plane, the node and the images (~20 min on 2 cores, cached after).
# PYTHONDONTWRITEBYTECODE is emptied: the suite starts many Python processes (the
# CLI, agents, recoveryd, workers), and each would compile agent_saga from source again
# (~0.5 s of CPU each); with it set, pytest also rewrites every test module's asserts anew.
# langsmith (a dependency of the LangChain adapter) registers a pytest plugin no test uses:
# blocked, it costs every pytest process ~2 s of imports.
PYTEST_FAST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -p no:langsmith_plugin
test: test-deps
	$(PYTEST_FAST) tests -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Everything the suites need, prepared in parallel: the two pip installs and the image
# build overlap the Go builds (which take turns on one lock).
test-deps:
	@$(MAKE) --no-print-directory -j4 install crewai-venv system-deps control-plane stripe-mock promtool node mcp-servers

# The Redis integration suite against a 3-master Redis Cluster instead of one server
# (AGENT_SAGA_TEST_REDIS=cluster makes the redis_server fixture a cluster): every
# integration module that talks to Redis. `make test` runs the suite on one server plus
# the cluster cross-section (test_redis_cluster.py, one test per kind of data, with a slot
# migration) and the Sentinel failover tests; docs/ha-redis.md.
REDIS_SUITE = $(sort $(wildcard tests/integration/test_*redis*.py tests/integration/test_plane_*.py \
	tests/integration/test_policy_*.py tests/integration/test_cli_plane_stores.py \
	tests/integration/test_killswitch_marker.py tests/integration/test_limit_source_marker.py \
	tests/integration/test_recovery*.py tests/integration/test_wal_contract.py tests/integration/test_wal_secrets.py))
test-redis-cluster: install system-deps
	AGENT_SAGA_TEST_REDIS=cluster $(PY) -m pytest $(REDIS_SUITE) $(PYTEST_ARGS)

# redis-server, PostgreSQL and the node's packages (containerd, runc, CNI plugins,
# iptables, buildah, mmdebstrap) from Debian (no-op when present). See docs/control-plane.md.
system-deps:
	bash hack/install-system-deps.sh

# etcd, kube-apiserver, kubectl, helm built from their Go modules into
# ~/.cache/agent-saga/bin (once; KUBEBUILDER_ASSETS / TEST_ASSET_* binaries win).
control-plane:
	bash hack/build-control-plane.sh

# stripe-mock (the Stripe connector's conformance server) built from its Go module into
# ~/.cache/agent-saga/bin (once; TEST_ASSET_STRIPE_MOCK wins). A failed build fails here.
stripe-mock:
	bash hack/build-control-plane.sh stripe-mock

# promtool (Prometheus's rule checker and rule unit tester) built from its Go module into
# ~/.cache/agent-saga/bin (once; TEST_ASSET_PROMTOOL wins). See docs/observability.md.
promtool:
	bash hack/build-control-plane.sh promtool

# The third-party MCP servers from npm the proxy's tests run against (the reference
# "everything" and filesystem servers; Node.js >= 20), pinned in hack/versions.env,
# hack/npm/ and hack/mcp-servers/, installed once into ~/.cache/agent-saga/npm (offline
# after). mcp-server-git comes from PyPI with the dev extra. See docs/mcp.md.
mcp-servers:
	bash hack/install-mcp-servers.sh

# The single-node cluster's binaries (kubelet, kube-controller-manager, kube-scheduler,
# kube-proxy, CoreDNS; Go modules) and images (buildah over a Debian base), in parallel;
# cached in ~/.cache/agent-saga. See docs/control-plane.md, "The single-node cluster".
node: system-deps
	bash hack/build-control-plane.sh node coredns & build=$$!; \
	bash hack/build-images.sh >/dev/null; wait $$build

# A real single-node cluster for a person (the one the node suite runs); prints the
# `export KUBECONFIG=...` line. Stop it with `make cluster-down`.
cluster: install system-deps control-plane node
	@$(RUN) hack/cluster.py up

cluster-down:
	@if [ -x $(PY) ]; then $(RUN) hack/cluster.py down; else $(FIXTURES_ENV) $(PYTHON) hack/cluster.py down; fi

# A local control plane + Redis for a person; prints the `export KUBECONFIG=...` lines.
dev-cluster: install system-deps control-plane
	@$(RUN) hack/dev-cluster.py up

dev-cluster-down:
	@if [ -x $(PY) ]; then $(RUN) hack/dev-cluster.py down; else $(FIXTURES_ENV) $(PYTHON) hack/dev-cluster.py down; fi

unit: install crewai-venv
	$(PYTEST_FAST) tests/unit $(PYTEST_ARGS)

# ruff, mypy --strict, then the layer contracts of pyproject.toml ([tool.importlinter]; see docs/architecture.md).
lint: install
	$(VENV)/bin/ruff check runtime operator recoveryd tests bench examples hack
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

typecheck: install
	$(VENV)/bin/mypy

# CustomResourceDefinitions in crds/ and charts/agent-saga/crds/, generated from the
# operator's models (a unit test fails when they differ).
crds: install
	$(PY) -m agent_saga_operator.crdgen

# The Helm chart: lint --strict with every values file, then render/apply/RBAC tests on
# the local control plane.
chart-lint: control-plane
	helm=$$(bash hack/build-control-plane.sh --print-paths 2>/dev/null | sed -n 's/^helm=//p'); \
	$$helm lint --strict charts/agent-saga; \
	for f in charts/agent-saga/ci/*.yaml; do $$helm lint --strict charts/agent-saga -f $$f; done

# The chart's alert rules copied to deploy/prometheus/ (a unit test fails when they differ).
monitoring:
	$(PYTHON) hack/monitoring.py

chart-test: install control-plane
	$(PY) -m pytest tests/unit/k8s/test_chart_values.py tests/e2e/test_chart_render.py tests/e2e/test_chart_apiserver.py

# Benchmarks print ratios against floors measured in the same run (never timed tests).
bench: install system-deps
	$(RUN) bench/bench_core.py
	$(RUN) bench/bench_hop.py
	$(RUN) bench/profile_latency.py
	$(RUN) bench/bench_wal.py
	$(RUN) bench/bench_limits.py
	$(RUN) bench/bench_killswitch.py
	$(RUN) bench/bench_mcp.py
	$(RUN) bench/bench_effector.py
	$(RUN) bench/bench_approvals.py
	$(RUN) bench/bench_passkey_speculation.py
	$(RUN) bench/bench_routing.py
	$(RUN) bench/bench_recovery_fleet.py
	$(RUN) bench/bench_ui.py
	$(RUN) bench/bench_ha_redis.py
	$(RUN) bench/bench_mesh.py
	$(RUN) bench/bench_isolation.py
	$(RUN) bench/bench_replay.py

# N real agents (10, 100, 300, 1000) on one policy plane: halt, Acknowledged, SagaPolicy,
# a shared budget, approvals, per-agent costs; JSON in bench/results/ (docs/performance.md).
FLEET_AGENTS ?= 10,100,300,1000
bench-fleet: install system-deps control-plane
	$(RUN) bench/fleet/fleet.py --agents $(FLEET_AGENTS) --out bench/results/fleet.json

# kubectl apply of a KillSwitch -> every agent pod refusing, on the single-node cluster.
bench-node: install system-deps control-plane node
	$(RUN) bench/bench_node.py

clean:
	rm -rf $(VENV) $(CREWAI_VENV) .pytest_cache .mypy_cache .ruff_cache
