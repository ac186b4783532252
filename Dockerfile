# syntax=docker/dockerfile:1
# One image, two entry points: `gpu-health-agent` (DaemonSet) and
# `gpu-health-operator` (Deployment); the Helm chart picks one with `command`.
#
#   make image    (docker build, or podman on a Debian-made base: hack/build-image.sh)
#
# Stage 1 builds our wheel and the wheels of its dependencies, then installs
# them into a virtualenv; stage 2 copies only that virtualenv onto a clean
# slim Python, so no compiler, pip cache or source tree reaches the image.
# The virtualenv keeps its bytecode (read-only root filesystem: without it,
# every start compiles the kubernetes client again: seconds of CPU) but
# not pip and setuptools, which nothing runs there (about 25 MB).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore), metadata first.
COPY pyproject.toml README.md LICENSE ./
COPY api/ api/
COPY agent/ agent/
COPY operator/ operator/
COPY sim/ sim/
COPY plugin/ plugin/
RUN pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/gpu-health \
 && /opt/gpu-health/bin/pip install --no-index --find-links /wheels gpu-health \
 && /opt/gpu-health/bin/gpu-health-agent --help >/dev/null \
 && /opt/gpu-health/bin/gpu-health-operator --help >/dev/null \
 && /opt/gpu-health/bin/pip uninstall --quiet --yes pip setuptools

FROM ${PYTHON_IMAGE}
ARG VERSION=0.2.0.dev0
LABEL org.opencontainers.image.title="gpu-health" \
      org.opencontainers.image.description="GPU fleet health: node agent (NVML/DCGM facts) and Kubernetes operator (cordon, drain, label)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# Non-root with a fixed numeric UID/GID (65532, the distroless "nonroot"), so
# the kubelet can verify runAsNonRoot without a passwd lookup.
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY --from=builder /opt/gpu-health /opt/gpu-health
# No .pyc writes (the root filesystem is read-only in the cluster), logs
# unbuffered; NVIDIA_* are read by the NVIDIA container runtime: inject NVML
# (utility) only, and no GPU unless the pod asks (the agent's DaemonSet sets all).
ENV PATH=/opt/gpu-health/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    NVIDIA_VISIBLE_DEVICES=void
USER 65532:65532
EXPOSE 8080 8081 9101
CMD ["gpu-health-operator"]
