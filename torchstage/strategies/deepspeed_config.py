"""A DeepSpeed config for torchstage: read from a dict or a JSON/YAML file, overrides laid over it, and what
``train()`` owns (micro batch size, accumulation, clipping, precision) filled in, a disagreement refused."""
import copy
import json
import numbers
import os

import torch

#: What ``DeepSpeed(config={"optimizer": {"type": ...}})`` builds, as DeepSpeed does with ``torch_adam: true``.
CONFIG_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


def engine_config(base: dict, dtype, batch_size, plan, world_size: int) -> dict:
    """The DeepSpeed config of one engine: ``base`` (the strategy's), with what ``train()`` owns filled in
    (``dtype``: the precision, the train loaders' ``batch_size``, the optimizer's :class:`StepPlan`) or checked."""
    config = copy.deepcopy(base)
    config.pop("optimizer", None)  # built by the strategy's setup: every engine gets a client optimizer
    clip = plan.grad_clip_norm
    agree(config, "train_micro_batch_size_per_gpu", batch_size,
          f"the train loader's batch_size ({batch_size})")
    agree(config, "gradient_accumulation_steps", plan.accumulation_steps,
          f"train(accumulation_steps={plan.accumulation_steps})")
    agree(config, "gradient_clipping", float(clip or 0.0), f"train(grad_clip_norm={clip})"
          + ("" if clip else " (no clipping; DeepSpeed's own default is 1.0)"))
    for key, ours in (("bf16", dtype is torch.bfloat16), ("fp16", dtype is torch.float16)):
        given = bool(config.get(key, {}).get("enabled", False))
        if key in config and given != ours:
            amp = {torch.bfloat16: "'bf16'", torch.float16: "'fp16'"}.get(dtype, "None")
            raise ValueError(f"DeepSpeed config {key}.enabled={given} disagrees with train(amp={amp}); set the "
                             f"precision in one place")
        if ours:
            config[key] = {**config.get(key, {}), "enabled": True}
    expected = config["train_micro_batch_size_per_gpu"] * plan.accumulation_steps * world_size
    agree(config, "train_batch_size", expected,
          f"batch_size x accumulation_steps x {world_size} processes ({expected})")
    config.update(managed_gradient_accumulation=False, zero_allow_untested_optimizer=True)
    config.setdefault("steps_per_print", 2 ** 62)
    return config


def read_config(config) -> dict:
    """A DeepSpeed config dict from a dict or a JSON/YAML file."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"DeepSpeed(config=...) must be a dict or a JSON/YAML file path, got {type(config).__name__}")
    path = os.fspath(config)
    if not os.path.isfile(path):
        raise ValueError(f"DeepSpeed(config={path!r}): no such file")
    with open(path) as f:
        text = f.read()
    try:
        if path.endswith((".yml", ".yaml")):
            import yaml
            loaded = yaml.safe_load(text)
        else:
            loaded = json.loads(text)
    except ValueError as e:  # json's and yaml's errors both derive from it
        raise ValueError(f"DeepSpeed(config={path!r}) cannot be read: {e}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"DeepSpeed(config={path!r}) must hold a mapping, got {type(loaded).__name__}")
    return loaded


def deep_merge(base: dict, over: dict) -> dict:
    for key, value in over.items():
        base[key] = deep_merge(base.get(key, {}), value) if isinstance(value, dict) and isinstance(
            base.get(key), dict) else value
    return base


def config_optimizer(config: dict):
    """The torch optimizer class name the config's ``optimizer`` section asks for (None without one)."""
    section = config.get("optimizer")
    if section is None:
        return None
    kind = str(section.get("type", "")).lower()
    if kind not in CONFIG_OPTIMIZERS:
        raise ValueError(f"DeepSpeed config optimizer type {section.get('type')!r} cannot be built by torchstage (it "
                         f"builds {sorted(CONFIG_OPTIMIZERS.values())}); pass your optimizer to train(optimizer=...)")
    return CONFIG_OPTIMIZERS[kind]


def agree(config: dict, key: str, ours, what: str) -> None:
    """Set ``config[key]`` to ``ours``; a different value already there is refused, naming both."""
    if ours is None:
        if key not in config:
            raise ValueError(f"strategy='deepspeed' needs {key}, which {what} does not give; set it in the "
                             f"DeepSpeed config")
        return
    given = config.get(key, ours)
    same = given == ours and not isinstance(given, bool) and isinstance(given, numbers.Number)
    if not same:
        raise ValueError(f"DeepSpeed config {key}={given!r} disagrees with {what}; set it in one place "
                         f"(torchstage fills it in from train())")
    config[key] = ours
