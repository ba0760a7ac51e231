"""Checking a config's keys and scalar types against ``train()``'s arguments, with the YAML path of a mistake: the
keys, types and defaults of :class:`~torchstage.runner.spec.TrainSpec`, made from the one declaration of the
arguments (:func:`~torchstage.runner.train_arguments.train_signature`), and of a stage (``StageSpec``)."""
import dataclasses
import difflib
import typing
from collections.abc import Mapping

from torchstage.config.instantiate import ConfigError, _matches, _scalar_kinds, join
from torchstage.runner.spec import TrainSpec
from torchstage.runner.spec_stages import STAGE_KEYS, StageSpec

#: Top-level keys that are not ``train`` arguments.
EXTRA_KEYS = ("runner",)


def train_keys() -> list:
    """The top-level keys a config accepts: every TrainSpec field plus ``runner``."""
    return [f.name for f in dataclasses.fields(TrainSpec) if f.init] + list(EXTRA_KEYS)


def check_config(config: Mapping) -> None:
    """Unknown keys and wrong scalar types, at the top level and in every stage, before anything is built."""
    _check_keys(config, train_keys(), "", "top-level key")
    _check_scalars(config, TrainSpec, "")
    stages = config.get("stages")
    if stages is None:
        return
    if not isinstance(stages, Mapping) or not stages:
        raise ConfigError("stages", f"expected a mapping of stage name -> settings, got {stages!r:.60}")
    for name, stage in stages.items():
        path = join("stages", name)
        if not isinstance(stage, Mapping):
            raise ConfigError(path, f"expected a mapping of stage settings ({', '.join(STAGE_KEYS)}), got "
                                    f"{type(stage).__name__} {stage!r:.40}")
        _check_keys(stage, STAGE_KEYS, path, "stage key")
        _check_scalars(stage, StageSpec, path)


def _check_keys(node: Mapping, accepted, path: str, what: str) -> None:
    for key in node:
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(join(path, key), f"unknown {what} {key!r}{hint}; accepted: {', '.join(accepted)}")


def _check_scalars(node: Mapping, spec_class, path: str) -> None:
    hints = typing.get_type_hints(spec_class)
    defaults = {f.name: f.default for f in dataclasses.fields(spec_class)}
    for key, value in node.items():
        kinds = _scalar_kinds(hints.get(key))
        if kinds is None or (value is None and defaults.get(key) is None):
            continue
        if not _matches(value, kinds):
            expected = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(join(path, key), f"expected {expected}, got {type(value).__name__} {value!r:.60}")
