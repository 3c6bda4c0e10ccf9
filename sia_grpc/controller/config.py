"""The controller's settings: a frozen dataclass from TOML, `SIA_*` environment
overrides on top, command-line flags on top of that."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sia_grpc.controller.stores import is_postgres
from sia_grpc.policy import POLICIES, SettingError
from sia_grpc.policy import params as policy_params
from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.params import PolicySpec
from sia_grpc.policy.queues import QueueSet


class ConfigError(ValueError):
    """A setting is missing, unknown or out of range; the message names it."""


@dataclass(frozen=True)
class ControllerConfig:
    listen: str = "127.0.0.1:50051"
    db_path: str = "sia-controller.db"  # ":memory:" keeps nothing across restarts
    policy: str = "sia"
    # Settings of each policy, {name: {setting: value}} ([policy.<name>] tables,
    # SIA_POLICY_<NAME>_<SETTING>, --policy-set); only those of `policy` are used.
    policy_params: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    round_duration: float = 60.0  # seconds between scheduling rounds; the policy's too
    early_round_delay: float = 2.0  # debounce before an arrival-triggered round
    # A new job identical to an earlier one (application, command, GPUs per replica,
    # the type's batch limits) takes that job's 1-GPU profile of a type instead of
    # waiting for an idle GPU to profile on (docs/architecture.md, "Profiling").
    reuse_profiles: bool = True
    # A job whose workers fail (a crash, a start-up error) is requeued from its last
    # checkpoint this many times before it is FAILED, as a Kubernetes Job's
    # backoffLimit: a fault of one node or one start (a port taken, a GPU reset) should
    # not end a user's run. 0: fail at the first.
    job_retries: int = 2
    solve_timeout: float = 45.0  # a slower solve keeps the previous allocation (≤ a round)
    heartbeat_interval: float = 5.0  # agents send one every this many seconds
    heartbeat_timeout: float = 15.0  # silence after which an agent is lost
    checkpoint_root: str = "/var/lib/sia/checkpoints"
    store_synchronous: str = "FULL"
    # The store, when not the SQLite file at db_path: a "postgresql://user@host/db" DSN
    # (docs/operations.md, "PostgreSQL store") or another SQLite path. Not in repr: a
    # DSN may carry a password (logs show `describe(store_target)`, redacted).
    store: str = field(default="", repr=False)
    # The PostgreSQL password, read from this file at start (else the DSN's, PGPASSWORD
    # or ~/.pgpass): never in the config, the environment listing or a log.
    store_password_file: str = ""
    # High availability (a postgresql:// store; docs/operations.md, "Running two
    # controllers (HA)"): the leader's lease on the store lasts lease_ttl_s, renewed
    # every third of it; `advertise` is where clients reach this controller, named to
    # them by a standby ("" = listen).
    lease_ttl_s: float = 4.0
    advertise: str = ""
    inline_solver: bool = False  # solve on a thread instead of a spawned process
    max_message_bytes: int = 16 << 20
    # Per tenant (0: no limit): jobs not yet ended, and CreateJob calls a second
    # with bursts of create_burst. Beyond them CreateJob is RESOURCE_EXHAUSTED.
    max_active_jobs: int = 0
    create_rate: float = 0.0
    create_burst: int = 0
    # Security (docs/security.md). Paths to PEM files; "" = not set.
    tls_cert: str = ""  # the controller's certificate (chain); with tls_key: TLS on
    tls_key: str = ""
    tls_client_ca: str = ""  # CA bundle that signs node-agent client certificates
    agent_listen: str = ""  # the mutual-TLS port for agents; "" = listen's port + 1
    tokens_file: str = ""  # TOML of SHA-256 token hashes → tenants; "" = anonymous admin
    allow_insecure: bool = False  # plaintext / no tokens on a non-loopback address
    # Prometheus: GET /metrics over plain HTTP, unauthenticated (counts only; bind it to
    # a private address). "" = off; port 0 = any free port (Controller.metrics_port).
    metrics_listen: str = ""
    # Queues (docs/operations.md, "Queues"): the [queues] table of the config file
    # (read at start), or queues_file, a queues TOML read again on SIGHUP; neither: one
    # `default` queue without guarantees (a flat pool, as before queues).
    queues: QueueSet = field(default_factory=QueueSet)
    queues_file: str = ""
    # The file this configuration was read from (set by `load_config`, never in the
    # file): SIGHUP reads its [queues] again when there is no queues_file.
    config_file: str = ""

    @property
    def store_target(self) -> str:
        """What the store is opened on: `store`, else `db_path`."""
        return self.store or self.db_path

    def store_password(self) -> str | None:
        """The password in store_password_file (its first line), or None without one."""
        if not self.store_password_file:
            return None
        try:
            return Path(self.store_password_file).read_text().splitlines()[0]
        except (OSError, UnicodeDecodeError, IndexError) as err:
            why = getattr(err, "strerror", None) or "empty or not text"
            raise ConfigError(f"store_password_file: cannot read {self.store_password_file}: "
                              f"{why}") from None

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def agent_address(self) -> str:
        """Where agents connect with their certificates: `agent_listen`, else (with
        tls_client_ca) listen's host and port + 1 (an ephemeral port for port 0);
        "" when agents use `listen` (no TLS)."""
        if self.agent_listen:
            return self.agent_listen
        if not (self.tls and self.tls_client_ca):
            return ""
        host, _, port = self.listen.rpartition(":")
        return f"{host}:{int(port) + 1 if int(port) else 0}"

    @property
    def policy_spec(self) -> PolicySpec:
        """The policy the rounds run: its name, its settings, and this round length."""
        chosen = self.policy_params.get(self.policy, {})
        return policy_params.PolicySpec(self.policy, tuple(sorted(chosen.items())),
                                        self.round_duration)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy: unknown {self.policy!r}; choose one of "
                              f"{', '.join(POLICIES)}")
        try:
            normalized = policy_params.from_toml(self.policy_params)
        except SettingError as err:
            raise ConfigError(str(err)) from None
        object.__setattr__(self, "policy_params", normalized)
        for name in ("round_duration", "early_round_delay", "solve_timeout",
                     "heartbeat_interval", "heartbeat_timeout", "lease_ttl_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: must be positive, got {getattr(self, name)}")
        for name in ("max_active_jobs", "create_rate", "create_burst"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name}: must be >= 0 (0: no limit), got {getattr(self, name)}")
        if not self.job_retries >= 0:
            raise ConfigError(f"job_retries: must be >= 0 (0: fail at the first failure), "
                              f"got {self.job_retries}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ConfigError("heartbeat_timeout: must exceed heartbeat_interval")
        object.__setattr__(self, "solve_timeout", min(self.solve_timeout, self.round_duration))
        for name in ("listen", "agent_listen", "metrics_listen", "advertise"):
            value = getattr(self, name)
            if (value or name == "listen") and not _host_port(value):
                raise ConfigError(f"{name}: expected HOST:PORT, got {value!r}")
        if self.queues_file and self.queues != QueueSet():
            raise ConfigError("queues_file: the queues are given twice, in a [queues] table and "
                              "in queues_file; give them in one place (queues_file to change "
                              "them with SIGHUP)")
        if self.store_password_file and not is_postgres(self.store_target):
            raise ConfigError("store_password_file: only for a postgresql:// store")
        self._check_security()

    def _check_security(self) -> None:
        from sia_grpc.security.tls import is_loopback

        if bool(self.tls_cert) != bool(self.tls_key):
            missing = "tls_key" if self.tls_cert else "tls_cert"
            raise ConfigError(f"{missing}: tls_cert and tls_key go together (PEM paths)")
        if self.tls_client_ca and not self.tls:
            raise ConfigError("tls_client_ca: needs tls_cert and tls_key (mutual TLS is TLS)")
        if self.agent_listen and not self.tls_client_ca and self.tls:
            raise ConfigError("agent_listen: needs tls_client_ca (the CA of agent certificates)")
        if self.allow_insecure:
            return
        exposed = [a for a in (self.listen, self.agent_address) if a and not is_loopback(a)]
        if exposed and not self.tls:
            raise ConfigError(
                f"tls_cert: listen {exposed[0]} is not a loopback address, and plaintext is "
                "allowed only on loopback; give tls_cert and tls_key (--tls-cert, "
                "--tls-key), or set allow_insecure (--allow-insecure) to serve plaintext "
                "anyway (not for production)")
        if exposed and not self.tokens_file:
            raise ConfigError(
                f"tokens_file: listen {exposed[0]} is not a loopback address, and without "
                "a tokens file every caller would be an admin; give tokens_file (--tokens; "
                "`sia tokens add` makes one), or set allow_insecure (--allow-insecure)")


def _host_port(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(sep) and port.isdigit()


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] = os.environ,
                policy_set: Sequence[str] = (), **overrides) -> ControllerConfig:
    """Defaults ← TOML file (`[controller]` table or top level, and `[policy.<name>]`
    tables) ← `SIA_<FIELD>` and `SIA_POLICY_<NAME>_<SETTING>` environment variables ←
    `overrides` and `policy_set` (command-line flags; None = not given)."""
    # field -> value, of the field's type (checked when ControllerConfig is made)
    values: dict[str, Any] = {}
    settings: dict[str, dict[str, object]] = {}  # policy -> setting -> value, merged
    fields = {f.name: f for f in dataclasses.fields(ControllerConfig)}
    if path is not None:
        values, from_file = _read_toml(path, fields)
        values["config_file"] = str(path)
        _merge(settings, from_file)
    for name, f in fields.items():
        raw = env.get(f"SIA_{name.upper()}")
        if raw is not None and name not in ("policy_params", "queues", "config_file"):
            values[name] = _parse(name, raw, f.type)
    _merge(settings, _env_settings(env))
    _merge(settings, _flag_settings(policy_set))
    values.update({k: v for k, v in overrides.items() if v is not None})
    values["policy_params"] = settings
    try:
        return ControllerConfig(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def _read_toml(path: str | Path, fields: Mapping[str, object]) -> tuple[dict, dict]:
    """The file's controller settings, and its policy settings (normalized). The
    `policy` key is a name (`policy = "sia"`) or a table (`[policy] name = "sia"`,
    `[policy.sia] p = -1`); beside a `[controller]` table it may be top level."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    section = dict(data.get("controller", data))
    given = [section.pop("policy", None), data.get("policy") if "controller" in data else None]
    tables = [dict(g) for g in given if isinstance(g, Mapping)]
    if len(tables) > 1:
        raise ConfigError(f"{path}: policy: a table both in [controller] and at the top "
                          "level; give one")
    table = tables[0] if tables else {}
    names = [g for g in (*given, table.pop("name", None)) if g is not None and
             not isinstance(g, Mapping)]
    if len(names) > 1:
        raise ConfigError(f"{path}: policy: named twice ({', '.join(map(repr, names))}); "
                          "name it once")
    values: dict[str, object] = {"policy": names[0]} if names else {}
    queues = [q for q in (section.pop("queues", None),
                          data.get("queues") if "controller" in data else None) if q is not None]
    if len(queues) > 1:
        raise ConfigError(f"{path}: queues: a table both in [controller] and at the top "
                          "level; give one")
    if queues:
        values["queues"] = _queues(queues[0], f"{path}: queues.")
    for key, value in section.items():
        if key not in fields or key in ("policy_params", "queues", "config_file"):
            raise ConfigError(f"{path}: unknown setting {key!r}")
        values[key] = value
    try:
        return values, policy_params.from_toml(table)
    except SettingError as err:
        raise ConfigError(f"{path}: {err}") from None


def _queues(table: object, where: str) -> QueueSet:
    """A queues document (`QueueSet.from_mapping`); ConfigError naming the key after
    `where` ("controller.toml: queues." + "queue[1].guarantee.rtx")."""
    if not isinstance(table, Mapping):  # (`queues = 3` in the config file)
        raise ConfigError(f"{where.rstrip('.')}: expected a table ([[queues.queue]] tables)")
    try:
        return QueueSet.from_mapping(table)
    except FieldError as err:
        raise ConfigError(f"{where}{err.field}: {err.problem}") from None


def read_config_queues(path: str | Path) -> QueueSet:
    """The [queues] of a controller configuration file (none: the default, one flat
    queue); ConfigError naming the file and the key at fault."""
    values, _ = _read_toml(path, {f.name: f for f in dataclasses.fields(ControllerConfig)})
    queues = values.get("queues", QueueSet())
    assert isinstance(queues, QueueSet)  # (`_queues` made it)
    return queues


def read_queues_file(path: str | Path) -> QueueSet:
    """The queues of a queues TOML file (`queues_file`, `sia simulate --queues`: top-level
    [[queue]] tables, ...); ConfigError naming the file and the key at fault."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"queues_file: {path}: {exc}") from None
    return _queues(data, f"queues_file: {path}: ")


def _env_name(policy: str) -> str:
    """How a policy is named in an environment variable: SIA_PARTITIONED."""
    return policy.upper().replace("-", "_")


def _env_settings(env: Mapping[str, str]) -> dict[str, dict[str, object]]:
    """`SIA_POLICY_SIA_P=-1` → {"sia": {"p": -1.0}}; any other SIA_POLICY_* is an error
    (`SIA_POLICY` itself names the policy)."""
    out: dict[str, dict[str, object]] = {}
    for var in sorted(env):
        rest = var.removeprefix("SIA_POLICY_")
        if rest == var:
            continue
        # (the longest first: SIA_PARTITIONED_P is sia-partitioned's p, not sia's)
        name = next((p for p in sorted(POLICIES, key=len, reverse=True)
                     if rest.startswith(_env_name(p) + "_")), None)
        if name is None:
            raise ConfigError(f"{var}: expected SIA_POLICY_<POLICY>_<SETTING> with POLICY "
                              f"one of {', '.join(_env_name(p) for p in POLICIES)}")
        setting = rest[len(_env_name(name)) + 1:].lower()
        try:
            _merge(out, {name: policy_params.normalize(name, {setting: env[var]})})
        except SettingError as err:
            raise ConfigError(f"{var}: {err.problem}") from None
    return out


def _flag_settings(items: Sequence[str]) -> dict[str, dict[str, object]]:
    """`--policy-set sia.p=-1` (repeatable; the last of a setting wins)."""
    out: dict[str, dict[str, object]] = {}
    for text in items:
        try:
            name, setting, raw = policy_params.assignment(text)
            _merge(out, {name: policy_params.normalize(name, {setting: raw})})
        except SettingError as err:
            raise ConfigError(f"--policy-set {err}") from None
    return out


def _merge(into: dict[str, dict[str, object]], more: Mapping[str, Mapping[str, object]]) -> None:
    for name, values in more.items():
        into.setdefault(name, {}).update(values)


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
