"""What the runtime checkpoints, when, and which checkpoint it resumes from.

A checkpoint holds the library's own state under "sia" and every registered
object's state_dict under its name. Rank 0 writes it (`sia_grpc.train.checkpoint`
makes the file atomic); on resume rank 0 chooses the newest loadable checkpoint
and every rank loads that one (the directory is shared). A refused (planted)
newest file fails every rank's resume (`checkpoint.CheckpointRefused` on rank 0).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from sia_grpc.train import checkpoint as ckpt
from sia_grpc.train.distributed import all_reduce_sum
from sia_grpc.train.telemetry import Overheads

__all__ = ["Checkpointer"]


class Checkpointer:
    """The registered states and the job's checkpoints in `directory` (None: none)."""

    def __init__(self, directory: str | None, interval_s: float, generation: int,
                 overheads: Overheads) -> None:
        self.directory = directory
        self.interval_s = interval_s    # periodic checkpoints (0: only on a stop)
        self.generation = generation
        self.overheads = overheads
        self.states: dict[str, Any] = {}
        self.restored: dict[str, Any] | None = None  # the checkpoint resumed from
        self.restored_from: tuple[int, str] | None = None  # (generation, path)
        self.last = time.monotonic()    # when the last checkpoint was written
        self.steps_at_last = 0

    def register(self, name: str, obj: Any) -> None:
        """Checkpoint `obj` (anything with state_dict/load_state_dict) as `name`;
        restore it now if the checkpoint being resumed holds `name`."""
        if name == "sia":
            raise ValueError("the name 'sia' is reserved")
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise TypeError(f"{name}: {type(obj).__name__} has no state_dict/load_state_dict")
        self.states[name] = obj
        if self.restored is not None and name in self.restored:
            obj.load_state_dict(self.restored[name])

    def resume(self, rank: int, device: torch.device) -> dict | None:
        """The "sia" entry of the checkpoint to resume from (all ranks call this
        together), or None to start afresh."""
        if not self.directory:
            return None
        t0 = time.perf_counter()
        # Rank 0 chooses; everyone loads that one (the directory is shared).
        found, refused = None, None
        if rank == 0:
            try:
                found = ckpt.newest_loadable(self.directory,
                                             self.generation if self.generation else None)
            except ckpt.CheckpointRefused as e:
                refused = e
        # -1: rank 0 refused a planted file; every rank fails rather than waiting on it.
        code = -1.0 if refused is not None else (found[0] + 1 if found else 0.0)
        gen = all_reduce_sum([code], device)[0]
        if refused is not None:
            raise refused
        if gen < 0:
            raise RuntimeError(f"rank 0 refused the newest checkpoint in {self.directory} "
                               "(it holds objects the loader does not allow; see rank 0's log)")
        if gen <= 0:
            return None
        gen = int(gen) - 1
        if found is None:
            path = ckpt.checkpoint_path(self.directory, gen)
            found = (gen, path, ckpt.load_checkpoint(path))
        _, path, data = found
        self.restored = data
        self.restored_from = (gen, str(path))
        self.overheads.restore_s = time.perf_counter() - t0
        return data["sia"]

    def due(self, now: float, steps: int) -> bool:
        """A periodic checkpoint is due (and there is something new to save)."""
        return bool(self.directory and self.interval_s > 0
                    and now - self.last >= self.interval_s and steps > self.steps_at_last)

    def save(self, sia: dict, steps: int) -> tuple[Path, float]:
        """Write this generation's checkpoint now (rank 0): its path and seconds taken."""
        assert self.directory
        data = {"sia": sia}
        for name, obj in self.states.items():
            data[name] = obj.state_dict()
        path = ckpt.checkpoint_path(self.directory, self.generation)
        save_s = ckpt.save_atomic(data, path)
        ckpt.prune_checkpoints(self.directory, keep=2, generation=self.generation)
        self.overheads.checkpoint_save_s.append(save_s)
        self.last = time.monotonic()
        self.steps_at_last = steps
        return path, save_s
