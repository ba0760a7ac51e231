"""Weights written in the safetensors format, as Hugging Face's ``save_pretrained`` lays them out:
``model.safetensors``, or ``model-0000x-of-0000y.safetensors`` shards and their ``model.safetensors.index.json``
when they exceed one shard. Files are written beside their final names and renamed into place, the index last."""
import json
import os
import re

import torch

from torchstage.files.atomic import fsync_folder
from torchstage.files.pretrained import SAFETENSORS_FILE, SAFETENSORS_INDEX

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?B)?\s*$", re.IGNORECASE)
_UNITS = {None: 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12}


def parse_size(text) -> int:
    """``"5GB"``, ``"100KB"`` or a number of bytes as bytes (decimal units, as transformers reads them)."""
    if isinstance(text, int):
        return text
    found = _SIZE.match(str(text))
    if not found:
        raise ValueError(f"a size must be a number of bytes or end in KB, MB, GB or TB (e.g. 5GB), got {text!r}")
    return int(float(found.group(1)) * _UNITS[found.group(2).upper() if found.group(2) else None])


def save_safetensors(state: dict, folder: str, max_shard_size="5GB", metadata: dict = None) -> list:
    """Write ``state`` (name -> tensor) into ``folder`` in shards of at most ``max_shard_size`` bytes (a tensor larger
    than that gets a shard of its own); returns the files written. Tensors sharing memory (tied weights) are copied
    apart, as safetensors stores each name once."""
    from safetensors.torch import save_file  # the optional dependency: pip install torchstage[hf]
    limit = parse_size(max_shard_size)
    shards, current, size = [], {}, 0
    seen = set()
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if tensor.numel() else None
        if key in seen or not tensor.is_contiguous():
            tensor = tensor.clone().contiguous()
        seen.add(key)
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > limit:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    shards.append(current)
    os.makedirs(folder, exist_ok=True)
    names = ([SAFETENSORS_FILE] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for name, shard in zip(names, shards):
        tmp = os.path.join(folder, f".{name}.tmp")
        save_file(shard, tmp, metadata={"format": "pt", **(metadata or {})})
        os.replace(tmp, os.path.join(folder, name))
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for s in shards for t in s.values())},
                 "weight_map": {key: name for name, shard in zip(names, shards) for key in shard}}
        tmp = os.path.join(folder, f".{SAFETENSORS_INDEX}.tmp")
        with open(tmp, "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
        os.replace(tmp, os.path.join(folder, SAFETENSORS_INDEX))
        names.append(SAFETENSORS_INDEX)
    fsync_folder(folder)
    return names


def is_tensor_state(state) -> bool:
    """True for a dict of name -> tensor (what safetensors stores)."""
    return isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
