"""Job specs from YAML, TOML or JSON files, checked for shape before they go on the wire.

Only shape and type are checked here, so that a typo fails with the file's field
name before a round trip; what the values mean (min_gpus <= max_gpus, known GPU
types) is the controller's call.
"""

from __future__ import annotations

import difflib
import json
import math
import pathlib
import re
import shlex
import tomllib
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from sia_grpc.api import pb

ADAPTIVITY = {"adaptive": pb.ADAPTIVITY_ADAPTIVE,
              "strong-scaling": pb.ADAPTIVITY_STRONG_SCALING,
              "rigid": pb.ADAPTIVITY_RIGID}
_UINT32, _UINT64 = 2**32 - 1, 2**64 - 1


class SpecError(ValueError):
    """A spec that cannot become a JobSpec; `field` is its path ("spec.min_gpus")."""

    def __init__(self, field: str, message: str, *, path: str = "",
                 line: int | None = None) -> None:
        self.field, self.detail, self.path, self.line = field, message, path, line
        text = f"{field}: {message}" if field else message
        if path:
            text = f"{path}:{line}: {text}" if line else f"{path}: {text}"
        super().__init__(text)


def _describe(value: Any) -> str:
    return "nothing" if value is None else repr(value)


def _uint(limit: int) -> Callable[[str, Any], int]:
    def check(field: str, value: Any) -> int:
        # bool is an int in Python, but `min_gpus: yes` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise SpecError(field, f"expected a non-negative integer, got {_describe(value)}")
        return value
    return check


def _number(field: str, value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0):
        raise SpecError(field, f"expected a non-negative number, got {_describe(value)}")
    return float(value)


def _string(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise SpecError(field, f"expected a string, got {_describe(value)}")
    return value


def _strings(field: str, value: Any) -> list[str]:
    if isinstance(value, str):  # `allowed_gpu_types: rtx` means the one type
        return [value]
    if not isinstance(value, list):
        raise SpecError(field, f"expected a list of strings, got {_describe(value)}")
    return [_string(f"{field}[{i}]", v) for i, v in enumerate(value)]


def _command(field: str, value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as err:
            raise SpecError(field, f"cannot split into words: {err}") from None
    return _strings(field, value)


def _adaptivity(field: str, value: Any) -> int:
    key = value.strip().lower().replace("_", "-") if isinstance(value, str) else None
    if key not in ADAPTIVITY:
        raise SpecError(field, f"expected one of {', '.join(ADAPTIVITY)}, got {_describe(value)}")
    return ADAPTIVITY[key]


def _mapping(field: str, value: Any, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise SpecError(field, f"expected a mapping of {what}, got {_describe(value)}")
    return value


def _unknown(field: str, key: Any, known: Any) -> SpecError:
    near = difflib.get_close_matches(str(key), list(known), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return SpecError(f"{field}.{key}", f"unknown field{hint}")


def _key(field: str, key: Any) -> str:
    if not isinstance(key, str):
        raise SpecError(field, f"keys must be strings, got {_describe(key)}")
    return key


def _labels(field: str, value: Any) -> dict[str, str]:
    return {_key(field, k): _string(f"{field}.{k}", v)
            for k, v in _mapping(field, value, "strings to strings").items()}


_LIMIT_KEYS = {"min": "min_local_batch_size", "max": "max_local_batch_size"}


def _type_batch_limits(field: str, value: Any) -> list[Any]:
    out = []
    for gpu_type, limits in _mapping(field, value, "GPU type to {min, max}").items():
        where = f"{field}.{gpu_type}"
        kwargs = {}
        for key, bound in _mapping(where, limits, "min/max to integers").items():
            if key not in _LIMIT_KEYS:
                raise _unknown(where, key, _LIMIT_KEYS)
            kwargs[_LIMIT_KEYS[key]] = _uint(_UINT32)(f"{where}.{key}", bound)
        out.append(pb.TypeBatchLimits(gpu_type=_key(field, gpu_type), **kwargs))
    return out


# JobSpec field -> the check that turns a file's value into the field's value.
_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "name": _string,
    "application": _string,
    "command": _command,
    "adaptivity": _adaptivity,
    "min_gpus": _uint(_UINT32),
    "max_gpus": _uint(_UINT32),
    "num_gpus": _uint(_UINT32),
    "allowed_gpu_types": _strings,
    "batch_size": _uint(_UINT32),
    "max_batch_size": _uint(_UINT32),
    "type_batch_limits": _type_batch_limits,
    "epochs": _number,
    "samples": _uint(_UINT64),
    "pipeline_gpus": _uint(_UINT32),
    "restart_cost_s": _number,
    "tenant": _string,
    "labels": _labels,
    "queue": _string,
    "priority": _string,
    "env": _labels,
    "memory_mib_per_gpu": _uint(_UINT32),
}


def spec_from_mapping(data: Mapping, *, source: str = "spec") -> pb.JobSpec:
    """A JobSpec from a parsed file; field paths in errors start with `source`."""
    if not isinstance(data, Mapping):
        raise SpecError(source, f"expected a mapping of JobSpec fields, got {_describe(data)}")
    values = {}
    for key, value in data.items():
        if key not in _FIELDS:
            raise _unknown(source, key, _FIELDS)
        values[key] = _FIELDS[key](f"{source}.{key}", value)
    if "epochs" in values and "samples" in values:
        raise SpecError(f"{source}.samples", "set epochs or samples, not both")
    labels, env = values.pop("labels", {}), values.pop("env", {})
    spec = pb.JobSpec(**values)
    spec.labels.update(labels)
    spec.env.update(env)
    return spec


def spec_to_mapping(spec: pb.JobSpec) -> dict[str, Any]:
    """The inverse of spec_from_mapping, leaving out fields at their defaults."""
    out: dict[str, Any] = {}
    for field in spec.DESCRIPTOR.fields:
        name = field.name
        if name in ("epochs", "samples"):
            if spec.WhichOneof("target") == name:  # an explicit 0 epochs is kept
                out[name] = getattr(spec, name)
            continue
        value = getattr(spec, name)
        if name == "adaptivity":
            names = {v: k for k, v in ADAPTIVITY.items()}
            if value in names:
                out[name] = names[value]
        elif name == "type_batch_limits":
            if value:
                out[name] = {t.gpu_type: {k: getattr(t, f) for k, f in _LIMIT_KEYS.items()
                                          if getattr(t, f)} for t in value}
        elif name in ("labels", "env"):
            if value:
                out[name] = dict(value)
        elif field.is_repeated:
            if value:
                out[name] = list(value)
        elif value:
            out[name] = value
    return out


_TOML_WHERE = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def load_spec(path: str | pathlib.Path) -> pb.JobSpec:
    """A JobSpec from a .yaml/.yml, .toml or .json file (OSError if it cannot be read)."""
    path = pathlib.Path(path)
    return parse_spec(path.read_text(encoding="utf-8"), path.suffix, name=str(path))


def parse_spec(text: str, suffix: str = ".yaml", *, name: str = "<stdin>") -> pb.JobSpec:
    """A JobSpec from a spec file's text, parsed by `suffix` (YAML, which JSON also
    is, by default: what `sia submit -` reads); errors start with `name`."""
    suffix = suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise SpecError("", f"unknown file type {suffix or '(none)'!r}: "
                                "expected .yaml, .yml, .toml or .json", path=name)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError("", f"invalid YAML: {problem}", path=name,
                        line=mark.line + 1 if mark else None) from None
    except tomllib.TOMLDecodeError as err:
        # tomllib (3.11) puts the position only in the message: "... (at line 2, column 12)".
        where = _TOML_WHERE.search(str(err))
        problem = _TOML_WHERE.sub(f" (column {where.group(2)})" if where else "", str(err))
        raise SpecError("", f"invalid TOML: {problem}", path=name,
                        line=int(where.group(1)) if where else None) from None
    except json.JSONDecodeError as err:
        raise SpecError("", f"invalid JSON: {err.msg}", path=name,
                        line=err.lineno) from None
    try:
        return spec_from_mapping(data)
    except SpecError as err:
        raise SpecError(err.field, err.detail, path=name) from None
