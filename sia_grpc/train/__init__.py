"""sia_grpc.train: what a PyTorch data-parallel training script adds so that the
Sia scheduler can resize it (modelled on AdaptDL's API).

    import sia_grpc.train as st

    st.init()
    model = st.AdaptiveDataParallel(model, optimizer, lr_scheduler)
    loader = st.AdaptiveDataLoader(dataset, batch_size=64)
    for epoch in st.remaining_epochs_until(30):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()

See docs/training.md. `sia_grpc.train.contract` (the agent↔worker environment)
imports without torch; everything else here is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AdaptiveDataLoader", "AdaptiveDataParallel", "current_epoch", "init", "overheads",
    "progress", "rank", "register_state", "remaining_epochs_until", "scale_invariant_steps",
    "world_size",
]

_LAZY = {
    "AdaptiveDataLoader": "sia_grpc.train.loader",
    "AdaptiveDataParallel": "sia_grpc.train.parallel",
    "remaining_epochs_until": "sia_grpc.train.epochs",
    "current_epoch": "sia_grpc.train.epochs",
    "init": "sia_grpc.train.runtime",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rt():
    from sia_grpc.train.runtime import current

    return current()


def register_state(name: str, obj: Any) -> None:
    """Checkpoint `obj` (state_dict/load_state_dict) under `name`; restored at once
    if the checkpoint being resumed has it."""
    _rt().register_state(name, obj)


def progress() -> float:
    """Fraction of the target's samples trained on, 0..1 (0 without a target)."""
    return _rt().progress()


def scale_invariant_steps() -> float:
    """Training progress in steps at the initial batch size: the sum of the gains."""
    return _rt().si_steps


def rank() -> int:
    return _rt().rank


def world_size() -> int:
    return _rt().world_size


def overheads() -> dict[str, float]:
    """What the library costs per step (gradient statistics, agreement), measured."""
    return _rt().overheads.summary()
