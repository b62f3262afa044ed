"""Load topology specs from TOML (``tomllib``) or YAML (only if PyYAML is importable), and write TOML back.

The file is a table whose keys are the fields of :class:`LeafSpineSpec` or :class:`DumbbellSpec` plus ``kind``
(``"leafspine"``, the default, or ``"dumbbell"``). Nested specs are tables (``[fabric_link]``, ``[spine_queue]``,
``[tcp]``), classes an array of tables (``[[classes]]`` with an optional ``[classes.queue]``), per-port overrides
another (``[[ports]]``, topologies/overrides.py). Unknown keys are errors. Every error is a :class:`SpecError`
naming the field path, e.g. ``fabric_link.rate_mbps: must be > 0 (got -5)`` or ``classes[1].xon_bytes: ...``.
"""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping, Union

from .dumbbell import DumbbellSpec
from .leafspine import LeafSpineSpec
from .spec import SpecError, spec_dict
from .spec.base import _got
from .topology import Topology

KINDS: dict[str, type] = {"leafspine": LeafSpineSpec, "dumbbell": DumbbellSpec}


def load_topology(path: str | Path) -> Topology:
    """Read a ``.toml``, ``.yaml`` or ``.yml`` file into a topology spec."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError("", f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError("", f"cannot read {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            return loads_toml(text)
        if suffix in (".yaml", ".yml"):
            return loads_yaml(text)
    except SpecError as e:
        raise SpecError(e.path, e.message, source=str(path)) from None
    raise SpecError("", f"{path}: unknown topology file type {suffix!r} (use .toml, .yaml or .yml)")


def loads_toml(text: str) -> Topology:
    import tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError("", f"invalid TOML: {e}") from None
    return from_dict(data)


def loads_yaml(text: str) -> Topology:
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        raise SpecError("", "YAML topologies need PyYAML, which is not installed; install it or use TOML") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError("", f"invalid YAML: {' '.join(str(e).split())}") from None
    return from_dict(data)


def from_dict(data: Any) -> Topology:
    """Build a topology spec from plain data (what TOML/YAML parse to)."""
    if not isinstance(data, Mapping):
        raise SpecError("", f"a topology must be a table/mapping (got {type(data).__name__})")
    data = dict(data)
    kind = data.pop("kind", "leafspine")
    if not isinstance(kind, str) or kind not in KINDS:
        raise SpecError("kind", f"unknown topology kind {_got(kind)} (allowed: {', '.join(KINDS)})")
    return _build(KINDS[kind], data, "")


def to_dict(spec: Topology) -> dict[str, Any]:
    """The plain-data form of a spec (``kind`` first; None fields omitted); ``from_dict(to_dict(s)) == s``."""
    return {"kind": spec.kind, **spec_dict(spec)}


def dumps_toml(spec: Topology) -> str:
    """Serialise a spec to TOML that :func:`loads_toml` reads back to an equal spec."""
    return _toml_table(to_dict(spec), ())


# ---- dict -> dataclass ------------------------------------------------------------------------------------------


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise SpecError(path or cls.__name__, f"must be a table (got {_got(data)})")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls) if f.init}
    for key in data:
        if key not in known:
            raise SpecError(_join(path, str(key)), f"unknown field (allowed: {', '.join(known)})")
    kwargs = {}
    for name, f in known.items():
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], _join(path, name))
        elif f.default is MISSING and f.default_factory is MISSING:  # type: ignore[misc]
            raise SpecError(_join(path, name), "required field is missing")
    own = getattr(cls, "KIND", "")
    try:
        return cls(**kwargs)
    except SpecError as e:
        raise e.rebased(own, path) from None


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(value, args[0], path) if len(args) == 1 else value
    if is_dataclass(tp):
        return _build(tp, value, path)
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            raise SpecError(path, f"must be a list (got {_got(value)})")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        return tuple(value)  # fixed-size tuples are checked by the spec itself
    if origin is frozenset:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple, set, frozenset)):
            raise SpecError(path, f"must be a list (got {_got(value)})")
        try:
            return frozenset(value)
        except TypeError:  # a nested list or table is not a set member
            raise SpecError(path, f"must be a list of plain values (got {_got(value)})") from None
    return value  # scalars are type-checked (and ints widened to float) by the specs' own validation


# ---- TOML writer (tomllib only reads) ---------------------------------------------------------------------------


def _toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v} to TOML")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _toml_table(d: Mapping[str, Any], path: tuple[str, ...]) -> str:
    lines: list[str] = []
    for k, v in d.items():
        if not isinstance(v, dict) and not _is_table_array(v):
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in d.items():
        sub = path + (k,)
        name = ".".join(_toml_key(x) for x in sub)
        if isinstance(v, dict):
            out += f"\n[{name}]\n" + _toml_table(v, sub)
        elif _is_table_array(v):
            for item in v:
                out += f"\n[[{name}]]\n" + _toml_table(item, sub)
    return out


__all__ = ["load_topology", "loads_toml", "loads_yaml", "from_dict", "to_dict", "dumps_toml", "KINDS"]
