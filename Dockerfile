# syntax=docker/dockerfile:1.7
#
# The images charts/agent-saga runs: one Dockerfile, two targets.
#
#   docker build --target operator  -t ghcr.io/agent-saga/agent-saga-operator:0.1.0  .
#   docker build --target recoveryd -t ghcr.io/agent-saga/agent-saga-recoveryd:0.1.0 .
#
# Each target is a python:3.11-slim runtime holding one virtualenv (/opt/venv) with the
# package installed with that target's extra only ("operator" or "recoveryd"; the recoveryd
# image, which also runs the `agent-saga mcp` sidecar, adds "fast": uvloop): no
# compiler, no pip cache, no source tree. Processes run as UID/GID 65532 (non-root; the
# chart's securityContext sets the same and a read-only root filesystem). Bytecode is
# compiled at build time, so nothing is written at run time but /tmp (an emptyDir).
#
# Pin the base by digest for a reproducible build (docs/install.md, "Images"):
#   docker buildx imagetools inspect python:3.11.13-slim-bookworm   # -> sha256:...
#   docker build --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:... ...
# Your compensators and reconcilers (recoveryd.imports) go into an image built FROM the
# recoveryd one: `FROM ghcr.io/agent-saga/agent-saga-recoveryd:0.1.0`, `USER 0:0`,
# `RUN pip install ...`, `USER 65532:65532` (examples/payments/Dockerfile does exactly that).
#
# Any Debian 12 image with python3, python3-venv and python-is-python3 works as the base:
# the test suite builds both targets with buildah over one made from a Debian root
# filesystem, offline (hack/build-images.sh), and runs them on a real node.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# ---------------------------------------------------------------- build: one venv per extra
FROM ${PYTHON_IMAGE} AS build-base
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore): editing tests, docs or the chart
# does not invalidate this layer.
COPY pyproject.toml README.md ./
COPY runtime/ runtime/
COPY operator/ operator/
COPY recoveryd/ recoveryd/

FROM build-base AS build-operator
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-compile ".[operator]" \
 && /opt/venv/bin/python -m compileall -q -j 0 /opt/venv/lib \
 && /opt/venv/bin/python -c "import agent_saga, agent_saga_operator.__main__"

FROM build-base AS build-recoveryd
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-compile ".[recoveryd,fast]" \
 && /opt/venv/bin/python -m compileall -q -j 0 /opt/venv/lib \
 && /opt/venv/bin/python -c "import agent_saga, agent_saga_recoveryd.app, psycopg, psycopg_pool, uvloop"

# ---------------------------------------------------------------- runtime base
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 65532 agentsaga \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin agentsaga
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.source="https://github.com/agent-saga/agent-saga" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532

# ---------------------------------------------------------------- the operator
FROM runtime AS operator
COPY --from=build-operator /opt/venv /opt/venv
LABEL org.opencontainers.image.title="agent-saga-operator"
# 8080: /healthz (kopf liveness); 9090: /metrics.
EXPOSE 8080 9090
ENTRYPOINT ["python", "-m", "agent_saga_operator"]

# ---------------------------------------------------------------- the recovery fleet
FROM runtime AS recoveryd
COPY --from=build-recoveryd /opt/venv /opt/venv
LABEL org.opencontainers.image.title="agent-saga-recoveryd"
# 9102: /metrics, /livez, /readyz.
EXPOSE 9102
ENTRYPOINT ["python", "-m", "agent_saga_recoveryd"]
