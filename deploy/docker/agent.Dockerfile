# syntax=docker/dockerfile:1
#
# sia-nodeagent: one per GPU node. It runs each job's `command` as worker
# processes *inside this container*, so the image carries CUDA-enabled torch
# (from the official PyTorch image), the project with its `train` extra, and
# nvidia-ml-py (NVML: the agent finds the GPUs it was given and their type).
#
# Build from the repository root:
#
#   docker build -f deploy/docker/agent.Dockerfile -t sia-nodeagent:0.1.0 .
#
# Your training code and its dependencies must be in the image too: build your own
# image FROM this one (COPY your scripts, pip install your requirements) and point
# the DaemonSet at it. The base's Python must be >= 3.11 (pytorch/pytorch 2.5.1
# ships 3.11). Pin it by digest in your registry for reproducible builds.
ARG TORCH_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${TORCH_IMAGE}

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# tini: PID 1 that forwards SIGTERM to the agent (which checkpoints its jobs) and
# reaps orphaned worker children.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sia_grpc ./sia_grpc
# torch is already in the base image and satisfies the `train` extra (torch>=2.2),
# so pip keeps that CUDA build instead of downloading another.
RUN python -m pip install ".[train]" "nvidia-ml-py==12.570.172" \
 && python -c "import torch, pynvml, sia_grpc.nodeagent.torchbackend" \
 && rm -rf /src
# The same non-root uid/gid as the controller image and the Kubernetes manifests.
RUN groupadd --system --gid 10001 sia \
 && useradd --system --uid 10001 --gid sia --home-dir /var/lib/sia --no-create-home \
            --shell /usr/sbin/nologin sia \
 && install -d -o sia -g sia -m 0750 /var/lib/sia /var/lib/sia/agent
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /var/lib/sia/agent
# No port: the agent dials the controller. Multi-node jobs' workers listen on the
# MASTER_PORT the controller picks (the DaemonSet uses the host's network for that).
ENTRYPOINT ["tini", "--", "sia-nodeagent", "--backend", "torch"]
CMD ["--help"]
