"""Policy settings by name: the one parser behind every place users set them.

The controller's `[policy.<name>]` TOML tables, `SIA_POLICY_<NAME>_<KEY>` and
`--policy-set`, `sia simulate --policy-config/--set` and `OptimizeRequest.params`
all hand their raw values (TOML values or strings) to `make_policy` /
`normalize`, which check each key against the fields of that policy's frozen
config, convert the value to the field's type, run the config's own checks and
raise `SettingError` naming the key on any problem.

The round length is not among the settings: a policy always runs on the rounds
of whoever runs them (the controller's `round_duration`, the simulator's
`--round-duration`, `OptimizeRequest.round_duration_s`), passed as
`make_policy(..., round_duration=)`; a setting of that name is refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sia_grpc.policy.baselines import (
    FifoPolicy,
    GavelPolicy,
    PartitionedSiaPolicy,
    PolluxPolicy,
)
from sia_grpc.policy.sia import SiaPolicy
from sia_grpc.policy.sia_plus import SiaPlusPolicy
from sia_grpc.policy.types import Policy, SettingError

# A policy class (called with no arguments, for its defaults), or a stand-in for one.
PolicyClass = Callable[[], Policy]

POLICIES: dict[str, PolicyClass] = {
    "sia": SiaPolicy, "pollux": PolluxPolicy, "gavel": GavelPolicy, "fifo": FifoPolicy,
    "sia-partitioned": PartitionedSiaPolicy, "sia-plus": SiaPlusPolicy}

# `lambda_` is the field (λ; `lambda` is a Python keyword), but `lambda` is what
# people write in TOML and environment variables: both are accepted.
ALIASES = {"lambda": "lambda_"}

ROUND_DURATION = (
    "not a policy setting: the policy runs on the rounds' own length; set the "
    "controller's round_duration (TOML, SIA_ROUND_DURATION or --round-duration), "
    "sia simulate --round-duration, or OptimizeRequest.round_duration_s")

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@dataclass(frozen=True)
class Setting:
    """One user-settable knob of a policy, for listings (docs, `--help`)."""

    name: str
    kind: str  # "float", "int", "bool" or "str"
    default: object
    help: str


def policy_class(name: str, policies: Mapping[str, PolicyClass] = POLICIES) -> PolicyClass:
    try:
        return policies[name]
    except KeyError:
        raise SettingError("policy", f"unknown {name!r}; choose one of "
                                     f"{', '.join(policies)}") from None


def _fields(default: Policy) -> dict[str, dataclasses.Field[object]]:
    """The settable fields of a policy's config: those declared with a help text."""
    config = getattr(default, "config", None)
    if config is None:
        return {}
    return {f.name: f for f in dataclasses.fields(config) if "help" in f.metadata}


def settings(name: str, policies: Mapping[str, PolicyClass] = POLICIES) -> list[Setting]:
    """Each setting of the named policy, with that policy's default and help."""
    default = policy_class(name, policies)()
    config = getattr(default, "config", None)
    return [Setting(f.name, str(f.type), getattr(config, f.name), f.metadata["help"])
            for f in _fields(default).values()]


def normalize(name: str, params: Mapping[str, object],
              policies: Mapping[str, PolicyClass] = POLICIES) -> dict[str, object]:
    """`params` checked and converted: {config field: value of the field's type}.
    Raises SettingError naming the key (`sia.lamda`) on an unknown key or bad value."""
    default = policy_class(name, policies)()
    fields = _fields(default)
    values: dict[str, object] = {}
    given: dict[str, str] = {}  # field -> the key it was given as (an alias, maybe)
    for key, raw in params.items():
        field = ALIASES.get(key, key)
        if field == "round_duration":
            raise SettingError(key, ROUND_DURATION, name)
        if field not in fields:
            raise SettingError(key, _unknown(key, name, fields), name)
        if field in given:
            raise SettingError(key, f"given twice (also as {given[field]})", name)
        given[field] = key
        try:
            values[field] = convert(str(fields[field].type), raw)
        except ValueError as err:
            raise SettingError(key, str(err), name) from None
    _build(default, values, name, given)  # the config's own checks (ranges, names)
    return values


def make_policy(name: str, params: Mapping[str, object] = {}, *,  # noqa: B006 (read only)
                round_duration: float | None = None,
                policies: Mapping[str, PolicyClass] = POLICIES) -> Policy:
    """The named policy with `params` over its defaults and, unless None, the
    rounds' length. Raises SettingError naming the key at fault."""
    values = normalize(name, params, policies)
    if round_duration is not None:
        try:
            values["round_duration"] = convert("float", round_duration)
        except ValueError as err:
            raise SettingError("round_duration", str(err)) from None
    return _build(policy_class(name, policies)(), values, name, {})


def _build(default: Policy, values: Mapping[str, object], name: str,
           given: Mapping[str, str]) -> Policy:
    # (`default`: a policy, a dataclass whose `config`, where it has settings, is one too)
    if not values:
        return default
    config = getattr(default, "config", None)
    if config is None or isinstance(default, type) or not dataclasses.is_dataclass(default):
        # (a policy without settings: a test's)
        raise SettingError(next(iter(values)), f"{name} takes no settings")
    try:
        config = dataclasses.replace(config, **values)
    except SettingError as err:  # from the config's __post_init__: name the user's key
        raise SettingError(given.get(err.setting, err.setting), err.problem,
                           "" if err.setting == "round_duration" else name) from None
    return dataclasses.replace(default, config=config)


def _unknown(key: str, name: str, fields: Iterable[str]) -> str:
    known = [*fields, *(a for a, f in ALIASES.items() if f in fields)]
    if not known:
        return f"unknown setting; {name} has no settings"
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown setting; did you mean {ALIASES.get(close[0], close[0])}?"
    return f"unknown setting; {name}'s settings are {', '.join(fields)}"


def convert(kind: str, raw: object) -> object:
    """`raw` (a TOML value, or a string from a flag, the environment or a request)
    as `kind` ("float", "int", "bool", "str"); ValueError saying what it must be."""
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ValueError(f"must be true or false, got {raw!r}")
    if kind == "str":
        if isinstance(raw, str):
            return raw
        raise ValueError(f"must be a string, got {raw!r}")
    if kind == "int":
        try:
            if isinstance(raw, int | str) and not isinstance(raw, bool):
                return int(raw)
        except ValueError:
            pass
        raise ValueError(f"must be an integer, got {raw!r}")
    try:
        if isinstance(raw, int | float | str) and not isinstance(raw, bool):
            value = float(raw)
            if math.isfinite(value):
                return value
    except ValueError:
        pass
    raise ValueError(f"must be a finite number, got {raw!r}")


def current(policy: Policy) -> dict[str, object]:
    """Every setting of a built policy, and its round length (for records)."""
    config = getattr(policy, "config", None)  # (there, where it has settings)
    out = {f: getattr(config, f) for f in _fields(policy)}
    out["round_duration"] = policy.round_duration
    return out


def label(name: str, values: Mapping[str, object]) -> str:
    """How results name a policy run with `values`: `sia`, `sia(p=-1,lambda_=2)`."""
    if not values:
        return name
    return f"{name}({','.join(f'{k}={show(v)}' for k, v in values.items())})"


def show(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def assignment(text: str, policies: Mapping[str, PolicyClass] = POLICIES) -> tuple[str, str, str]:
    """A flag's "sia.p=-1" → ("sia", "p", "-1"); SettingError naming what is wrong."""
    key, eq, value = text.partition("=")
    key = key.strip()
    if not eq or not key:
        raise SettingError(key or text, "expected POLICY.SETTING=VALUE, e.g. sia.p=-1")
    name, _, setting = key.partition(".")
    if not setting:
        raise SettingError(key, "expected POLICY.SETTING, e.g. sia.p")
    if name not in policies:
        raise SettingError(key, f"unknown policy {name!r}; choose one of {', '.join(policies)}")
    return name, setting, value.strip()


def from_toml(table: object, where: str = "policy") -> dict[str, dict[str, object]]:
    """A TOML table of `[<where>.<name>]` tables ({name: {setting: value}}), each
    normalized; SettingError naming `<where>.<name>.<setting>`."""
    if not isinstance(table, Mapping):
        raise SettingError(where, "must be a table of [policy.<name>] tables")
    out: dict[str, dict[str, object]] = {}
    for name, params in table.items():
        if name not in POLICIES and not isinstance(params, Mapping):
            raise SettingError(name, "unknown key; a policy's settings go in its own table, "
                                     f"e.g. [{where}.sia] p = -1", where)
        if name not in POLICIES:
            raise SettingError(name, f"unknown policy; choose one of {', '.join(POLICIES)}",
                               where)
        if not isinstance(params, Mapping):
            raise SettingError(name, f"must be a table of settings, e.g. [{where}.{name}] "
                                     "p = -1", where)
        try:
            out[name] = normalize(name, params)
        except SettingError as err:
            raise SettingError(err.setting, err.problem, f"{where}.{name}") from None
    return out


@dataclass(frozen=True)
class PolicySpec:
    """A policy to build, as plain hashable data: it crosses to the controller's
    solver process, which builds (and caches) the policy from it."""

    name: str = "sia"
    params: tuple[tuple[str, object], ...] = ()
    round_duration: float | None = None  # None: the policy's own default

    def build(self) -> Policy:
        return make_policy(self.name, dict(self.params), round_duration=self.round_duration)


def settings_table() -> str:
    """Every policy's settings as a markdown table (`sia policy-settings`;
    docs/operations.md holds it)."""
    lines = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for name in POLICIES:
        for s in settings(name):
            lines.append(f"| `{name}.{s.name}` | {s.kind} | `{show(s.default)}` | {s.help} |")
    none = [name for name in POLICIES if not settings(name)]
    return "\n".join(lines) + (f"\n\n{' and '.join(none)} have no settings." if none else "")
