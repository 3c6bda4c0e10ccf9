"""The gpu check's training job: `sia_grpc.train.examples.mlp`, run as it is, with the
indices of every micro-batch its loader serves recorded.

    python -m sia_grpc.bench.gpu_check_worker [mlp's arguments]

With `GPU_CHECK_RECORD=1` (in the job spec's `env`), each training process writes,
in `$SIA_CHECKPOINT_DIR/gpu-check-record/`, `gen<generation>-rank<rank>.idx` (the
sample indices of each micro-batch the AdaptiveDataLoader gave the training loop, one
a line, in order: its `current_indices`) and `gen<generation>-rank<rank>.json` (what the process saw
of the GPUs: CUDA_VISIBLE_DEVICES, torch.cuda.device_count(), the device's name).
Profiling passes (SIA_PROFILE) record nothing. Without the variable it is the example.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from sia_grpc.bench.gpu_check_steps import RECORD
from sia_grpc.train.examples import mlp
from sia_grpc.train.loader import AdaptiveDataLoader


def gpu_view() -> dict[str, Any]:
    """What this process sees of the node's GPUs."""
    cuda = torch.cuda.is_available()
    return {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda_available": cuda,
            "device_count": torch.cuda.device_count() if cuda else 0,
            "device_name": torch.cuda.get_device_name(0) if cuda else None,
            "pid": os.getpid()}


def main(argv: list[str] | None = None) -> None:
    if not os.environ.get("GPU_CHECK_RECORD") or os.environ.get("SIA_PROFILE"):
        mlp.main(argv)
        return
    # In the job's checkpoint folder: the one folder of its own that every agent it
    # runs on shares, and that it may write under any isolation level.
    root = os.path.join(os.environ["SIA_CHECKPOINT_DIR"], RECORD)
    os.makedirs(root, exist_ok=True)
    name = f"gen{os.environ.get('SIA_GENERATION', '0')}-rank{os.environ.get('RANK', '0')}"
    with open(os.path.join(root, f"{name}.json"), "w") as f:
        json.dump(gpu_view(), f)
    fetch = AdaptiveDataLoader._fetch  # the loader's one way to a micro-batch

    with open(os.path.join(root, f"{name}.idx"), "a") as log:
        def recorded(self: AdaptiveDataLoader, plan: Any, micro: int) -> Any:
            batch = fetch(self, plan, micro)
            log.write("".join(f"{i}\n" for i in self.current_indices))
            log.flush()
            return batch

        AdaptiveDataLoader._fetch = recorded  # type: ignore[method-assign]
        try:
            mlp.main(argv)
        finally:
            AdaptiveDataLoader._fetch = fetch  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
