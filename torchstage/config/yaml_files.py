"""YAML config files: safe loading, merging several files, ``--set KEY.PATH=VALUE`` overrides, dumping."""
import copy
import os
import re
import sys
from collections.abc import Mapping

import yaml

from torchstage.config.instantiate import TARGET, ConfigError


class _Loader(yaml.SafeLoader):
    """YAML 1.1 safe loading, except that ``1e-3`` is a float (as in YAML 1.2), not the string ``'1e-3'``."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def parse_yaml(text: str, source: str):
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ConfigError(source, f"invalid YAML: {exc}") from exc


def load_config(paths, overrides=()) -> dict:
    """Merge the YAML files in order (later keys win), then apply ``a.b.c=value`` overrides."""
    config = {}
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        try:
            with open(path, encoding="utf-8") as f:
                data = parse_yaml(f.read(), os.fspath(path))
        except OSError as exc:
            raise ConfigError(os.fspath(path), f"cannot read config file: {exc.strerror}") from exc
        if data is None:
            continue
        if not isinstance(data, Mapping):
            raise ConfigError(os.fspath(path), f"a config file must hold a mapping of keys, got {type(data).__name__}")
        config = merge(config, data)
    for text in overrides:
        apply_override(config, text)
    return config


def merge(base, other):
    """Deep merge: mappings merge key by key, anything else is replaced; a new ``_target_`` replaces the node."""
    if not (isinstance(base, Mapping) and isinstance(other, Mapping)):
        return copy.deepcopy(other)
    if TARGET in other and other[TARGET] != base.get(TARGET):
        return copy.deepcopy(dict(other))  # another class: the old kwargs would not fit it
    merged = dict(base)
    for key, value in other.items():
        merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
    return merged


def apply_override(config: dict, text: str) -> None:
    """Set ``KEY.PATH=VALUE`` in place; VALUE is a YAML scalar or flow value (``3``, ``1e-3``, ``[3, 6]``, ``null``)."""
    where = f"--set {text!r}"
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(part.strip() for part in parts):
        raise ConfigError(where, "expected KEY.PATH=VALUE, e.g. --set optimizer.lr=0.01")
    value = parse_yaml(raw, where)
    node = config
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        here = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(where, f"{here}: {part!r} is not an index of the list at "
                                         f"{'.'.join(parts[:depth])} (length {len(node)})")
            part = int(part)
        elif not isinstance(node, dict):
            raise ConfigError(where, f"{'.'.join(parts[:depth])} is {type(node).__name__} {node!r:.40}, not a "
                                     f"mapping: cannot set {here}")
        if last:
            node[part] = value
        else:
            if isinstance(node, dict) and node.get(part) is None:
                node[part] = {}
            node = node[part]


def dump_config(config: Mapping) -> str:
    """The config as YAML, keys in their given order; ``load_config`` reads it back unchanged."""
    return yaml.safe_dump(_plain(config), sort_keys=False, default_flow_style=False)


def _plain(node):
    if isinstance(node, Mapping):
        return {key: _plain(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(value) for value in node]
    return node


def add_import_paths(configs) -> None:
    """``_target_: mycnn.SmallCNN`` finds ``mycnn.py`` beside a config file or in the current directory,
    as ``python -m torchstage`` would (the ``torchstage`` script alone puts neither on ``sys.path``)."""
    folders = [os.path.dirname(os.path.abspath(path)) for path in configs] + [os.getcwd()]
    sys.path[0:0] = [folder for folder in dict.fromkeys(folders) if folder not in sys.path]
