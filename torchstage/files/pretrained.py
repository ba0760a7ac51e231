"""Pretrained weights as a run starts from them (``train(init_from=PATH)``): read tensor by tensor, each rank only the
part it holds.

A source is one of: a consolidated ``.pth`` (a plain state dict, as ``torch.save(model.state_dict())`` writes it, or a
torchstage checkpoint file), a sharded torchstage checkpoint (a directory of DCP shards written on any mesh), a
``.safetensors`` file, or a Hugging Face folder (``save_pretrained``'s ``model.safetensors``, or its
``model-0000x-of-0000y.safetensors`` shards and their ``model.safetensors.index.json``). Each says the shape of every
tensor it holds without reading one (:meth:`WeightsSource.shapes`), so a model's keys are checked before training, and
fills a model's tensors in place (:meth:`WeightsSource.load_into`): a sharded parameter (a DTensor) gets the slice its
rank holds, read as a slice (safetensors' ``get_slice``, a memory-mapped ``.pth``, DCP's per-shard reads).
"""
import json
import os
import warnings

import torch

from torchstage.files.checkpoint_file import damaged_record
from torchstage.files.checkpoint_format import FORMAT, CheckpointError, clean_state_dict

#: The index Hugging Face's ``save_pretrained`` writes beside sharded safetensors files.
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_FILE = "model.safetensors"


class WeightsSource:
    """Tensors by name, read in slices; ``path`` names the source in messages."""

    path = ""

    def shapes(self) -> dict:
        """Name -> shape (a tuple) of every tensor the source holds, read without the tensors' data."""
        raise NotImplementedError

    def read(self, name: str, index: tuple) -> torch.Tensor:
        """The part ``index`` (one slice or index tensor per dimension) of tensor ``name``."""
        raise NotImplementedError

    def load_into(self, targets: dict) -> None:
        """Copy each named tensor into ``targets[name]`` (a tensor, or a DTensor whose local part is filled)."""
        with torch.no_grad():
            for name, target in targets.items():
                local, index = local_part(target)
                if local.numel():
                    local.copy_(_select(self.read(name, _boxed(index)), index))

    def close(self) -> None:
        """Let go of open files."""


def local_part(target) -> tuple:
    """``(local tensor, index)``: the tensor a rank holds of ``target`` and where it lies in the whole one (per
    dimension a slice, or the index tensor of the rows it holds where they are not contiguous)."""
    from torch.distributed.tensor import DTensor
    if not isinstance(target, DTensor):
        return target, tuple(slice(0, size) for size in target.shape)
    return target.to_local(), tuple(_held(target, dim) for dim in range(target.dim()))


def _held(target, dim: int):
    """The indices along ``dim`` of the part this rank holds of DTensor ``target``: its placements applied to the
    indices 0..n-1 of that dimension alone (no communication: each rank slices its own)."""
    from torch.distributed.tensor import Replicate, distribute_tensor
    shape = [1] * target.dim()
    shape[dim] = target.shape[dim]
    probe = torch.arange(target.shape[dim]).view(shape)
    # a shard of another dimension (Shard, and _StridedShard, which is no Shard subclass) holds all of this one
    placements = [Replicate() if getattr(p, "dim", dim) != dim else p for p in target.placements]
    held = distribute_tensor(probe, target.device_mesh, placements, src_data_rank=None).to_local().reshape(-1).cpu()
    if held.numel() == 0:
        return slice(0, 0)
    start = int(held[0])
    if torch.equal(held, torch.arange(start, start + held.numel())):
        return slice(start, start + held.numel())
    return held


def _boxed(index: tuple) -> tuple:
    """``index`` with each index tensor replaced by the slice that spans it (what a slice read can take)."""
    return tuple(i if isinstance(i, slice) else slice(int(i.min()), int(i.max()) + 1) for i in index)


def _select(part: torch.Tensor, index: tuple) -> torch.Tensor:
    """The rows ``index`` asks for out of ``part``, read as :func:`_boxed` spans them."""
    for dim, i in enumerate(index):
        if not isinstance(i, slice):
            part = part.index_select(dim, i - int(i.min()))
    return part


class StateDictSource(WeightsSource):
    """Tensors already in memory (a resumed checkpoint's model state) or memory-mapped (a ``.pth``)."""

    def __init__(self, state: dict, path: str = "<state dict>"):
        self.state, self.path = state, path

    def shapes(self):
        return {name: tuple(t.shape) for name, t in self.state.items() if isinstance(t, torch.Tensor)}

    def read(self, name, index):
        return self.state[name][index]


class SafetensorsSource(WeightsSource):
    """One ``.safetensors`` file, or a folder's shards by its index: each tensor read as the slice asked for."""

    def __init__(self, files: dict, path: str):
        self.files, self.path, self._open = files, path, {}  # name -> file; file -> its open handle

    def _handle(self, file: str):
        if file not in self._open:
            from safetensors import safe_open  # the optional dependency: pip install torchstage[hf]
            self._open[file] = safe_open(file, framework="pt", device="cpu")
        return self._open[file]

    def shapes(self):
        return {name: tuple(self._handle(file).get_slice(name).get_shape()) for name, file in self.files.items()}

    def read(self, name, index):
        return self._handle(self.files[name]).get_slice(name)[index]

    def close(self):
        self._open.clear()


class ShardedCheckpointSource(WeightsSource):
    """A model of a sharded torchstage checkpoint (DCP): every rank reads the shards that overlap its own part."""

    def __init__(self, path: str, model: str, metadata):
        self.path, self.model, self.metadata = path, model, metadata
        self.prefix = f"models.{model}."

    def shapes(self):
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        return {key[len(self.prefix):]: tuple(meta.size) for key, meta in self.metadata.state_dict_metadata.items()
                if key.startswith(self.prefix) and isinstance(meta, TensorStorageMetadata)}

    def load_into(self, targets):
        import torch.distributed.checkpoint as dcp  # heavy: sharded checkpoints only
        from torch.distributed.checkpoint import FileSystemReader
        metadata = self.metadata

        class Reader(FileSystemReader):
            def read_metadata(self, *args, **kwargs):  # read once, without running code from the file
                metadata.storage_meta.load_id = self.load_id
                return metadata

        state = {"models": {self.model: dict(targets)}}
        try:
            with warnings.catch_warnings():  # each rank reads its own shards: no_dist is meant
                warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
                dcp.load(state, storage_reader=Reader(self.path), no_dist=True)
        except Exception as e:  # DCP wraps what its reader raised
            raise CheckpointError(f"could not read the weights of init_from={self.path!r}: {str(e).strip()[-300:]}") \
                from None

    def read(self, name, index):
        whole = torch.empty(self.shapes()[name])
        self.load_into({name: whole})
        return whole[index]


def open_weights(path, model: str = "model", verify: bool = True) -> WeightsSource:
    """The source of ``path`` (see the module), for model ``model`` of a torchstage checkpoint; CheckpointError naming
    the path and what it holds when it is none of them. ``verify``: check a ``.pth`` file's CRC-32s (reading all of
    it, as the run's checks do before training; the loading itself then reads only the slices it needs)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, SAFETENSORS_INDEX)):
            with open(os.path.join(path, SAFETENSORS_INDEX)) as f:
                weight_map = json.load(f).get("weight_map", {})
            return SafetensorsSource({name: os.path.join(path, file) for name, file in weight_map.items()}, path)
        if os.path.isfile(os.path.join(path, SAFETENSORS_FILE)):
            return _safetensors_file(os.path.join(path, SAFETENSORS_FILE))
        if os.path.isfile(os.path.join(path, ".metadata")):
            return _sharded(path, model)
        raise CheckpointError(f"init_from={path!r} is a folder without {SAFETENSORS_INDEX}, {SAFETENSORS_FILE} or a "
                              f"sharded torchstage checkpoint's .metadata: give a Hugging Face save_pretrained folder, "
                              f"a checkpoint directory (logs/checkpoints/last.pth) or a .pth file")
    if not os.path.isfile(path):
        raise CheckpointError(f"init_from={path!r} does not exist")
    if path.endswith(".safetensors"):
        return _safetensors_file(path)
    return _pth(path, model, verify)


def _safetensors_file(path: str) -> SafetensorsSource:
    """The source of one ``.safetensors`` file (its header read now)."""
    from safetensors import safe_open  # the optional dependency: pip install torchstage[hf]
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())
    except Exception as e:
        raise CheckpointError(f"could not read safetensors file {path!r}: {e}") from None
    return SafetensorsSource({name: path for name in names}, path)


def _sharded(path: str, model: str) -> ShardedCheckpointSource:
    """The source of a sharded torchstage checkpoint (its metadata read safely now)."""
    from torchstage.files.sharded import read_metadata  # DCP: heavy
    metadata = read_metadata(path)
    models = sorted({key.split(".")[1] for key in metadata.state_dict_metadata if key.startswith("models.")})
    return ShardedCheckpointSource(path, _model_name(path, model, models), metadata)


def _pth(path: str, model: str, verify: bool) -> StateDictSource:
    """The source of a ``.pth`` file, memory-mapped, its checksums verified first (``verify``)."""
    damage = damaged_record(path) if verify else None
    if damage is not None:
        raise CheckpointError(f"init_from={path!r} is damaged: its content does not match the checksum written with "
                              f"it (in {damage})")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # tensors read when touched
    except Exception as e:
        raise CheckpointError(f"could not read init_from={path!r} with weights_only=True: "
                              f"{str(e).strip().splitlines()[0][:300]}") from None
    if isinstance(loaded, dict) and loaded.get("format") == FORMAT:
        models = loaded.get("models", {})
        loaded = models[_model_name(path, model, sorted(models))]
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise CheckpointError(f"init_from={path!r} holds a {type(loaded).__name__}, not a state dict (parameter name "
                              f"-> tensor) or a torchstage checkpoint")
    return StateDictSource(clean_state_dict(loaded), path)


def _model_name(path: str, model: str, models: list) -> str:
    """``model`` if the checkpoint holds it, else its only model."""
    if model in models:
        return model
    if len(models) == 1:
        return models[0]
    raise CheckpointError(f"init_from={path!r} holds models {models}, none named {model!r}; give init_from as a dict "
                          f"(model name -> path) or load the one you mean")


def check_keys(source: WeightsSource, expected: dict, aliases: dict = None, what: str = "the model") -> None:
    """ValueError, before training, naming the keys of ``expected`` (name -> shape) that ``source`` lacks, those it
    has beyond them and those of another shape; ``aliases`` (name -> name) are tied tensors, present if either is."""
    found = source.shapes()
    aliases = aliases or {}
    missing = [k for k in expected if k not in found and aliases.get(k) not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [f"{k}: {list(found[k])} in the source, {list(expected[k])} in {what}" for k in expected
              if k in found and tuple(found[k]) != tuple(expected[k])]
    if not (missing or unexpected or shapes):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({_few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({_few(unexpected)})")
    if shapes:
        parts.append(f"{len(shapes)} of another shape ({_few(shapes)})")
    hint = _prefix_hint(missing, unexpected)
    raise ValueError(f"init_from={source.path!r} does not match {what}: of its tensors, " + "; ".join(parts)
                     + (f". {hint}" if hint else "; load the checkpoint of this model, or build the model it was "
                                                 "saved from"))


def _few(names: list, n: int = 4) -> str:
    """The first ``n`` of ``names``, and how many more."""
    return ", ".join(map(str, names[:n])) + (f" and {len(names) - n} more" if len(names) > n else "")


def _prefix_hint(missing: list, unexpected: list) -> str:
    """Say so when the source's names are the model's with a prefix added or removed (a base model and its head)."""
    if not (missing and unexpected):
        return ""
    for a, b, how in ((missing, unexpected, "start with"), (unexpected, missing, "lack")):
        prefix = os.path.commonprefix([k for k in b]).rpartition(".")[0]
        if prefix and {f"{prefix}.{k}" for k in a} >= set(b):
            return (f"The source's names {how} {prefix + '.'!r} where the model's do not: the checkpoint is of "
                    f"{'a model around this one' if how == 'start with' else 'a part of this model'}")
    return ""
