"""DeepSpeed checkpoints in torchstage's layout: a directory per checkpoint, its names switched atomically.

A name such as ``last.pth`` links to a data directory ``.sharded-<id>`` (as FSDP's, see
:mod:`torchstage.files.sharded`) that holds ``torchstage.pth`` (the run's loop, RNG, callbacks, schedulers
and metrics, written by the main rank) and, per model, DeepSpeed's own checkpoint folder written by every
rank (``engine.save_checkpoint(data, tag=<model name>)``). DeepSpeed's files are ``torch.save`` pickles: they
are read with ``weights_only=True`` and an explicit list of the three DeepSpeed classes they hold, after
their records' CRC-32s are verified, so loading runs no code from them. Reading a checkpoint whole
consolidates each model's fp32 weights from the ZeRO partitions (DeepSpeed's ``zero_to_fp32`` merge).
"""
import contextlib
import glob
import importlib
import io
import os
import pickle
import uuid

import torch

from torchstage.files.atomic import fsync_folder, write_atomic_stream
from torchstage.files.checkpoint_file import damaged_record, dump, load_file
from torchstage.files.checkpoint_format import CheckpointError

#: The torchstage part of a DeepSpeed checkpoint directory.
STATE_FILE = "torchstage.pth"
#: The globals DeepSpeed's checkpoint files hold besides tensors and plain values, each by its exact name.
DEEPSPEED_GLOBALS = (("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
                     ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
                     ("deepspeed.utils.tensor_fragment", "fragment_address"))


def is_deepspeed(path: str) -> bool:
    """True for a checkpoint directory (or a link to one) written under ``strategy="deepspeed"``."""
    return os.path.isfile(os.path.join(path, STATE_FILE))


def save_deepspeed(state: dict, engines: dict, paths: list, engine, before_last=None) -> None:
    """Write one checkpoint from every rank (collective): DeepSpeed's files of each of ``engines`` (model name ->
    DeepSpeedEngine) and, from the main rank, ``state`` (the torchstage dict); then point ``paths`` at it in order,
    ``before_last()`` run before the last name. Until the switch the names keep the previous checkpoint."""
    from torchstage.files.sharded import DATA_PREFIX, switch
    folder = os.path.dirname(os.path.abspath(paths[0]))
    data = os.path.join(folder, DATA_PREFIX + engine.broadcast_object(uuid.uuid4().hex[:12]))
    if engine.is_main:
        os.makedirs(data, exist_ok=True)
    engine.barrier()
    try:
        for name, ds_engine in engines.items():
            ds_engine.save_checkpoint(data, tag=name, client_state={}, save_latest=False)
            _fsync_own_files(os.path.join(data, name), engine.rank)
        if engine.is_main:
            state = {**state, "meta": {**state.get("meta", {}), "sharded": True}}
            write_atomic_stream([os.path.join(data, STATE_FILE)], lambda f: dump(state, f))
    except OSError as e:
        raise CheckpointError(f"could not write DeepSpeed checkpoint {paths[0]!r}: {e}; the previous one, if any, "
                              f"is unchanged") from e
    engine.barrier()  # every rank's files are on disk
    if engine.is_main:
        switch(paths, data, before_last)


def _fsync_own_files(folder: str, rank: int) -> None:
    """fsync the files this rank wrote into a DeepSpeed checkpoint folder (rank 0: also the shared ones)."""
    for path in sorted(glob.glob(os.path.join(folder, "*.pt"))):
        name = os.path.basename(path)
        if f"zero_pp_rank_{rank}_" in name or (rank == 0 and not name.startswith("zero_pp_rank_")):
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    if rank == 0:
        fsync_folder(folder)


def safe_load(path: str, map_location="cpu"):
    """One of DeepSpeed's checkpoint files, its CRC-32s verified, unpickled with ``weights_only=True`` and only
    :data:`DEEPSPEED_GLOBALS` allowed; a damaged or refused file is a :class:`CheckpointError`."""
    damage = damaged_record(path)
    if damage is not None:
        raise CheckpointError(f"DeepSpeed checkpoint file {path!r} is damaged: its content does not match the "
                              f"checksum written with it (in {damage})")
    allowed = [getattr(importlib.import_module(module), name) for module, name in DEEPSPEED_GLOBALS]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        reason = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line or "global" in line),
                      "an object outside DeepSpeed's checkpoint classes")
        raise CheckpointError(f"refused to load {path!r}: it holds objects that only unpickling code could rebuild "
                              f"({reason.split(' Please use')[0]}), and torchstage loads DeepSpeed's files with "
                              f"weights_only=True so that no code from a file ever runs") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"could not read DeepSpeed checkpoint file {path!r}: {e}") from None


def load_deepspeed(path: str) -> dict:
    """The whole checkpoint in directory ``path``: the torchstage dict, each model's consolidated fp32 weights
    under ``models``, and under each optimizer's ``deepspeed`` entry the data directory its engine resumes from."""
    checkpoint = load_file(os.path.join(path, STATE_FILE))
    data = os.path.realpath(path)  # the names may be switched later by this very run: keep what was read
    for name, state in checkpoint["optimizers"].items():
        if "deepspeed" in state:
            state["deepspeed"] = {**state["deepspeed"], "path": data}
    checkpoint["models"] = {name: consolidate(os.path.join(data, name)) if os.path.isdir(os.path.join(data, name))
                            else state for name, state in checkpoint["models"].items()}  # untrained ones: as saved
    return checkpoint


def plain_optimizer_state(state: dict, optimizer, models: dict) -> dict:
    """A DeepSpeed checkpoint's optimizer ``state`` as torch's own state dict of ``optimizer`` (any other strategy,
    one process too): each parameter's state consolidated from the ZeRO partitions, by the names of ``models``
    (the plain models holding ``optimizer``'s parameters), and the saved hyperparameters of each group."""
    saved, ids = state["deepspeed"], [id(p) for group in optimizer.param_groups for p in group["params"]]
    holders = [name for name, model in models.items() if any(id(p) in set(ids) for p in model.parameters())]
    if len(holders) != 1 or len(state["param_groups"]) != len(optimizer.param_groups):
        raise CheckpointError(f"cannot continue DeepSpeed checkpoint {saved['path']!r} without DeepSpeed: its "
                              f"optimizer had {len(state['param_groups'])} parameter group(s) of one model; this one "
                              f"has {len(optimizer.param_groups)} over {holders or 'no model'}")
    folder, model = os.path.join(saved["path"], holders[0]), models[holders[0]]
    names = {id(p): name for name, p in model.named_parameters()}
    base = safe_load(sorted(glob.glob(os.path.join(folder, "*_optim_states.pt")), key=_rank_of)[0])
    from deepspeed.checkpoint import constants as keys  # heavy: DeepSpeed checkpoints only
    first = base[keys.OPTIMIZER_STATE_DICT]
    first = first.get("base_optimizer_state", first.get("optimizer_state_dict", {})).get("state", {})
    kinds = sorted(k for k, v in next(iter(first.values()), {}).items() if torch.is_tensor(v) and v.dim() > 0)
    merged = {kind: consolidate(folder, kind) for kind in kinds}
    plain, index = {}, 0
    for group_index, group in enumerate(optimizer.param_groups):
        steps = merged[kinds[0]]["step"][group_index] if kinds else {}
        for p in group["params"]:
            plain[index] = {**{k: v.clone() for k, v in steps.items()},
                            **{kind: merged[kind][names[id(p)]].view_as(p).to(p.dtype) for kind in kinds}}
            index += 1
    groups, start = [], 0
    for group, kept in zip(optimizer.param_groups, state["param_groups"]):
        groups.append({**{k: v for k, v in kept.items() if k != "params"},
                       "params": list(range(start, start + len(group["params"])))})
        start += len(group["params"])
    return {"state": plain, "param_groups": groups}


def consolidate(folder: str, optimizer_state: str = None) -> dict:
    """The full fp32 state dict of one model from DeepSpeed's checkpoint folder of any ZeRO stage, read safely; with
    ``optimizer_state`` (``"exp_avg"``...) that state of each parameter instead of its weights, and under
    ``"step"`` the per-(sub)group values of the other states (Adam's step count)."""
    from deepspeed.checkpoint import constants as keys  # heavy: DeepSpeed checkpoints only
    from deepspeed.utils import zero_to_fp32 as merge
    model_files = sorted(glob.glob(os.path.join(folder, "*_model_states.pt")), key=_rank_of)
    optim_files = sorted(glob.glob(os.path.join(folder, "*_optim_states.pt")), key=_rank_of)
    if not model_files or not optim_files:
        raise CheckpointError(f"{folder!r} is not a complete DeepSpeed checkpoint: it has {len(model_files)} model "
                              f"and {len(optim_files)} optimizer state files")
    models = [_model_state(safe_load(f), keys, merge) for f in model_files]
    optims = [safe_load(f)[keys.OPTIMIZER_STATE_DICT] for f in optim_files]
    stage, partitions = optims[0][keys.ZERO_STAGE], optims[0][keys.PARTITION_COUNT]
    world = max(partitions) if isinstance(partitions, list) else partitions
    if world != len(optims):
        raise CheckpointError(f"DeepSpeed checkpoint {folder!r} is incomplete: written by {world} processes but "
                              f"{len(optims)} optimizer state files are there")
    steps = None
    if optimizer_state is not None:  # the moments partitioned as the fp32 weights are: merged the same way
        base = [o["base_optimizer_state" if stage <= 2 else "optimizer_state_dict"]["state"] for o in optims]
        for o, state in zip(optims, base):
            flat = keys.SINGLE_PARTITION_OF_FP32_GROUPS if stage <= 2 else keys.FP32_FLAT_GROUPS
            o[flat] = [state[i][optimizer_state] for i in sorted(state)]
        steps = [{k: v for k, v in base[0][i].items() if v.dim() == 0} for i in sorted(base[0])]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its prints, bars
        state = _merge(merge, keys, stage, world, optims, models)
    merged = {key: tensor.detach().clone() for key, tensor in merge.to_torch_tensor(state).items()}
    return merged if steps is None else {**merged, "step": steps}


def _merge(merge, keys, stage: int, world: int, optims: list, models: list) -> dict:
    """DeepSpeed's merge of the ZeRO partitions of ``stage`` into named (lazy) fp32 tensors."""
    if stage <= 2:
        groups = [o[keys.SINGLE_PARTITION_OF_FP32_GROUPS] for o in optims]
        return merge._get_fp32_state_dict_from_zero2_checkpoint(world, groups, models, False,
                                                                optims[0].get(keys.PARAM_ALIGNMENT_PADDINGS))
    return merge._get_fp32_state_dict_from_zero3_checkpoint(world, [o[keys.FP32_FLAT_GROUPS] for o in optims],
                                                            models, False)


def _rank_of(path: str) -> int:
    """R of ``zero_pp_rank_<R>_mp_rank_00_*.pt`` (-1 for the one ``mp_rank_00_model_states.pt``)."""
    name = os.path.basename(path)
    return int(name.split("_")[3]) if name.startswith("zero_pp_rank_") else -1


def _model_state(state: dict, keys, merge):
    """DeepSpeed's per-model record of parameter shapes, buffers and shared parameters, as its merge takes it."""
    if keys.BUFFER_NAMES not in state:
        raise CheckpointError("a DeepSpeed model state file holds no buffer names: not a model state checkpoint")
    buffers = {k: v.float() if v.is_floating_point() else v for k, v in state["module"].items()
               if k in state[keys.BUFFER_NAMES]}
    return merge.zero_model_state(buffers=buffers, param_shapes=state[keys.PARAM_SHAPES],
                                  shared_params=[[k, v] for k, v in state["shared_params"].items()],
                                  ds_version=state.get(keys.DS_VERSION),
                                  frozen_param_shapes=state.get(keys.FROZEN_PARAM_SHAPES),
                                  frozen_param_fragments=state.get(keys.FROZEN_PARAM_FRAGMENTS))
