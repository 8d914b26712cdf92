# syntax=docker/dockerfile:1
# Image of the Iluvatar device plugin. Build it with `make image`, which passes VERSION and tags the
# image ix-device-plugin:<package version>. BASE_IMAGE must be a Debian-like image whose `python` is
# CPython >= 3.11 with pip; `make base-image` builds one from Debian packages for offline hosts.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# The plugin's wheel plus a wheel of every dependency, so the final stage installs offline. The
# optional pip-cert secret is a CA bundle for hosts whose path to the package index is TLS-intercepted.
RUN --mount=type=secret,id=pip-cert \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi; \
    python -m pip wheel --wheel-dir /wheels .

FROM ${BASE_IMAGE}
ARG VERSION=dev
ARG SOURCE_URL=
LABEL org.opencontainers.image.title="ix-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for Iluvatar CoreX GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Installs from the builder's wheels without copying them into a layer; no compiler or build
# front-end reaches this stage. pip itself is left, as in the base image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels ix-device-plugin \
    && useradd --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ixdp
# Non-root by default (demo, list, check-config need nothing more). The DaemonSet runs it as root and
# privileged because the kubelet's device-plugin directory and the GPU device nodes require it.
USER 10001:10001
ENTRYPOINT ["ix-device-plugin"]
