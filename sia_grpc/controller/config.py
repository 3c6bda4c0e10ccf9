"""The controller's settings: a frozen dataclass from TOML, `SIA_*` environment
overrides on top, command-line flags on top of that."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sia_grpc.policy import POLICIES


class ConfigError(ValueError):
    """A setting is missing, unknown or out of range; the message names it."""


@dataclass(frozen=True)
class ControllerConfig:
    listen: str = "127.0.0.1:50051"
    db_path: str = "sia-controller.db"  # ":memory:" keeps nothing across restarts
    policy: str = "sia"
    round_duration: float = 60.0  # seconds between scheduling rounds
    early_round_delay: float = 2.0  # debounce before an arrival-triggered round
    solve_timeout: float = 45.0  # a slower solve keeps the previous allocation (≤ a round)
    heartbeat_interval: float = 5.0  # agents send one every this many seconds
    heartbeat_timeout: float = 15.0  # silence after which an agent is lost
    checkpoint_root: str = "/var/lib/sia/checkpoints"
    store_synchronous: str = "FULL"
    inline_solver: bool = False  # solve on a thread instead of a spawned process
    max_message_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy: unknown {self.policy!r}; choose one of "
                              f"{', '.join(POLICIES)}")
        for name in ("round_duration", "early_round_delay", "solve_timeout",
                     "heartbeat_interval", "heartbeat_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ConfigError("heartbeat_timeout: must exceed heartbeat_interval")
        object.__setattr__(self, "solve_timeout", min(self.solve_timeout, self.round_duration))
        if ":" not in self.listen:
            raise ConfigError(f"listen: expected HOST:PORT, got {self.listen!r}")


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] = os.environ,
                **overrides) -> ControllerConfig:
    """Defaults ← TOML file (`[controller]` table or top level) ← `SIA_<FIELD>`
    environment variables ← `overrides` (command-line flags; None = not given)."""
    values: dict[str, object] = {}
    fields = {f.name: f for f in dataclasses.fields(ControllerConfig)}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        data = data.get("controller", data)
        for key, value in data.items():
            if key not in fields:
                raise ConfigError(f"{path}: unknown setting {key!r}")
            values[key] = value
    for name, f in fields.items():
        raw = env.get(f"SIA_{name.upper()}")
        if raw is not None:
            values[name] = _parse(name, raw, f.type)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ControllerConfig(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def _parse(name: str, raw: str, kind) -> object:
    kind = str(kind)
    try:
        if kind == "bool":
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise ConfigError(f"SIA_{name.upper()}: cannot read {raw!r} as {kind}") from None
    return raw
