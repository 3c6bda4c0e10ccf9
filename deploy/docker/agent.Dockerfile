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
# The work directory's parents: root's, and searchable by the jobs' uids, which pass
# through them to their own run folders (the agent makes /var/lib/sia/agent 0711).
# setpriv and mount (util-linux) run the DaemonSet's start-up step
# (deploy/k8s/base/nodeagent-daemonset.yaml). No bubblewrap: a pod cannot give the
# sandbox level (the DaemonSet runs --isolation user and says why).
RUN install -d -o root -g root -m 0755 /var/lib/sia \
 && install -d -o root -g root -m 0711 /var/lib/sia/agent \
 && command -v setpriv && command -v mount
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Root, as the DaemonSet runs it: the agent isolates each job under a uid and a
# cgroup of its own, which takes root (with only the capabilities the DaemonSet
# grants). As any other user it refuses to start (exit 2) unless given
# --isolation none. Its jobs run as root only at --isolation none.
USER 0:0
WORKDIR /var/lib/sia/agent
# No port: the agent dials the controller. Multi-node jobs' workers listen on the
# MASTER_PORT the controller picks (the DaemonSet uses the host's network for that).
ENTRYPOINT ["tini", "--", "sia-nodeagent", "--backend", "torch"]
CMD ["--help"]
