# syntax=docker/dockerfile:1
#
# sia-controller: the scheduler's control plane. No CUDA and no torch: the
# controller, the policy and the solver are numpy/scipy/HiGHS (torch is only in
# the project's `train` extra, which this image does not install).
#
# Build from the repository root (the context must contain pyproject.toml):
#
#   docker build -f deploy/docker/controller.Dockerfile -t sia-controller:0.1.0 .
#
# Run (the store lives in the /var/lib/sia volume; off loopback the controller
# requires TLS and a tokens file, see docs/security.md and docs/operations.md):
#
#   docker run -v sia-store:/var/lib/sia -v $PWD/pki:/etc/sia/tls:ro -p 50051-50052:50051-50052 \
#     sia-controller:0.1.0 --tls-cert /etc/sia/tls/controller.crt ...
#
# Pin the base image by digest in your own registry (python:3.11.13-slim-bookworm@sha256:...)
# for reproducible builds; the tag below is the version this project was tested with.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the package needs (see controller.Dockerfile.dockerignore).
COPY pyproject.toml README.md ./
COPY sia_grpc ./sia_grpc
# A virtual environment that the runtime stage copies whole. Every dependency ships
# manylinux wheels for CPython 3.11, so no compiler is needed. pip compiles the
# bytecode here: the root filesystem is read-only at run time.
RUN python -m venv /opt/sia \
 && /opt/sia/bin/pip install --upgrade "pip>=24" \
 && /opt/sia/bin/pip install .

FROM ${PYTHON_IMAGE}
# tini: PID 1 that forwards signals (SIGTERM stops gracefully, SIGHUP reloads the
# tokens and queues files) and reaps the solver's processes. sqlite3: online backups of the store
# (`sqlite3 /var/lib/sia/sia.db ".backup ..."`, docs/operations.md).
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini sqlite3 \
 && rm -rf /var/lib/apt/lists/*
# A fixed non-root uid/gid (10001), the same in the agent image and in the
# Kubernetes securityContext, so files on shared volumes have one owner.
RUN groupadd --system --gid 10001 sia \
 && useradd --system --uid 10001 --gid sia --home-dir /var/lib/sia --no-create-home \
            --shell /usr/sbin/nologin sia \
 && install -d -o sia -g sia -m 0750 /var/lib/sia
COPY --from=build /opt/sia /opt/sia
COPY deploy/docker/sia-healthcheck.py /usr/local/bin/sia-healthcheck
RUN chmod 0755 /usr/local/bin/sia-healthcheck
# SIA_* variables are the controller's settings (sia_grpc/controller/config.py);
# --config FILE and flags override them.
ENV PATH=/opt/sia/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SIA_LOG_FORMAT=json \
    SIA_LISTEN=0.0.0.0:50051 \
    SIA_DB_PATH=/var/lib/sia/sia.db
USER 10001:10001
WORKDIR /var/lib/sia
VOLUME ["/var/lib/sia"]
# 50051: clients (TLS + bearer tokens); 50052: node agents (mutual TLS; the
# controller's agent_listen, by default listen's port + 1); 9464: Prometheus
# /metrics, plain HTTP, only when metrics_listen is set (SIA_METRICS_LISTEN=0.0.0.0:9464).
EXPOSE 50051 50052 9464
# For docker/podman only; Kubernetes ignores it and runs the same command as its
# exec probe (deploy/k8s). Give SIA_CA=/path/to/ca.crt when the controller serves TLS.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["sia-healthcheck"]
ENTRYPOINT ["tini", "--", "sia-controller"]
