"""The contract between a node agent and the training workers it launches.

The agent starts one process per local GPU (data-parallel replica) with these
environment variables; `sia_grpc.train` reads them inside the user's script.
Everything here is plain constants so both sides import one definition.

The standard torch.distributed variables come first, so an unmodified
`torchrun`-style script runs too (as a rigid job, without the extras).
"""

from __future__ import annotations

__all__ = [
    "ENV_ACCUM_STEPS", "ENV_AGENT_ADDRESS", "ENV_AGENT_SOCKET", "ENV_AGENT_TOKEN",
    "ENV_ATOMIC_BATCH_SIZE", "ENV_BATCH_SIZE",
    "ENV_CHECKPOINT_DIR", "ENV_GENERATION", "ENV_GPU_TYPE", "ENV_JOB_ID", "ENV_PACE",
    "ENV_PROFILE", "ENV_TARGET_EPOCHS", "ENV_TARGET_SAMPLES", "EXIT_CHECKPOINTED",
    "EXIT_COMPLETED", "EXIT_PROFILED", "EXIT_STALE",
]

# torch.distributed's env:// rendezvous (set by the agent, read by torch).
# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT

ENV_JOB_ID = "SIA_JOB_ID"
ENV_GENERATION = "SIA_GENERATION"            # the directive generation these workers run
ENV_AGENT_SOCKET = "SIA_AGENT_SOCKET"        # Unix socket of the agent's WorkerService
# Without a socket: WorkerService at HOST:PORT over TCP, with this bearer token (the
# Slurm bridge's, docs/slurm.md).
ENV_AGENT_ADDRESS = "SIA_AGENT_ADDRESS"
ENV_AGENT_TOKEN = "SIA_AGENT_TOKEN"
ENV_CHECKPOINT_DIR = "SIA_CHECKPOINT_DIR"    # the job's checkpoint directory (all generations)
ENV_GPU_TYPE = "SIA_GPU_TYPE"                # the GPU type these workers run on

# The batch the scheduler chose for this generation (Allocation fields); it may
# change in place later through WorkerReply.
ENV_BATCH_SIZE = "SIA_BATCH_SIZE"                # global batch
ENV_ATOMIC_BATCH_SIZE = "SIA_ATOMIC_BATCH_SIZE"  # per-replica micro-batch
ENV_ACCUM_STEPS = "SIA_ACCUM_STEPS"              # micro-batches beyond the first per step

# The job's target from its spec, when it sets one (else the script's own).
ENV_TARGET_EPOCHS = "SIA_TARGET_EPOCHS"
ENV_TARGET_SAMPLES = "SIA_TARGET_SAMPLES"

# A profiling pass: comma-separated per-replica batch sizes to time a few steps
# each on one GPU; the worker reports (Telemetry.profile = true) and exits
# with EXIT_PROFILED without touching the job's checkpoints.
ENV_PROFILE = "SIA_PROFILE"

# GPU emulation on CPU: stretch every step to PACE × its measured compute time,
# so a declared GPU type runs at its relative speed. Absent or 1 = no pacing.
ENV_PACE = "SIA_PACE"

# Worker exit statuses. Anything else is a failure.
EXIT_COMPLETED = 0      # reached the target
EXIT_CHECKPOINTED = 75  # stopped on SIGTERM after a checkpoint (EX_TEMPFAIL)
EXIT_PROFILED = 76      # profiling pass done
EXIT_STALE = 77         # the agent said this generation is no longer current
