"""DeepSpeed engines' state moved in and out: a parameter's whole fp32 value, DeepSpeed's files loaded (safely, or
resharded from another world size) into an engine."""
import os

import torch

from torchstage.files.checkpoint_format import CheckpointError


def whole_fp32(deepspeed, param, stage: int) -> torch.Tensor:
    """A parameter's whole value: its fp32 master copy, or for a frozen one the (gathered) parameter itself."""
    data = deepspeed.utils.safe_get_full_fp32_param(param)
    if data is None:
        with deepspeed.zero.GatheredParameters([param], enabled=stage == 3):
            data = param.data.clone()
    return data.detach().clone()


def set_fp32(deepspeed, param, value: torch.Tensor, stage: int, world_size: int) -> None:
    """Set a trained parameter's fp32 master copy to its whole ``value`` (this rank's partition of it)."""
    if stage != 3:
        return deepspeed.utils.safe_set_full_fp32_param(param, value)
    # DeepSpeed 0.19's set_full_hp_param cuts the last rank's partition out of the unpadded value: pad it here
    optimizer = param._z3_optimizer
    partition, _ = optimizer._get_fp32_opt_state_partition(param, release_swap_buffers=False)
    size, rank = partition.numel(), optimizer._get_param_partition_rank(param)
    padded = torch.nn.functional.pad(value.flatten(), (0, size * world_size - value.numel()))
    partition.data.copy_(padded.narrow(0, size * rank, size))
    return None


def safe_checkpoint_engine(config):
    """DeepSpeed's torch checkpoint engine, loading its files with weights_only=True (see ``safe_load``)."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from torchstage.files.deepspeed_files import safe_load

    class SafeCheckpointEngine(TorchCheckpointEngine):
        def load(self, path, map_location=None):
            return safe_load(path, map_location=map_location)

    return SafeCheckpointEngine(config)


def load_into(ds_engine, optimizer, path: str, tag: str, resharded: bool) -> None:
    """DeepSpeed's files of ``tag`` into the engine (weights, fp32 partitions, optimizer state), or ``resharded``
    from another world size; the group hyperparameters torchstage set (the checkpoint's, or the new ones of
    ``resume_lr='new'``) are kept."""
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    if resharded:
        reshard_into(ds_engine, optimizer, os.path.join(path, tag))
    else:
        loaded, _ = ds_engine.load_checkpoint(path, tag=tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load its checkpoint {os.path.join(path, tag)!r}")
    for group, kept in zip(optimizer.param_groups, hyper):
        group.update(kept)


def reshard_into(ds_engine, optimizer, folder: str) -> None:
    """Optimizer state of another world size into this rank's partitions: each state consolidated per parameter,
    then cut as DeepSpeed cuts its fp32 partitions (ZeRO 1/2: each flat group; ZeRO-3: each parameter, padded);
    the checkpoint's weights cut the same way must give DeepSpeed's own partitions, else the layout is not
    understood and the resume is refused."""
    from torchstage.files.deepspeed_files import consolidate
    zero, rank, world = ds_engine.optimizer, ds_engine.global_rank, ds_engine.dp_world_size
    names = {id(p): n for n, p in ds_engine.module.named_parameters()}
    states = {key: consolidate(folder, key) for key in ("exp_avg", "exp_avg_sq")}
    states["weights"] = consolidate(folder)
    stage3 = hasattr(zero, "fp32_partitioned_groups_flat")  # ZeRO-3's optimizer
    groups = zip(zero.fp16_groups, zero.fp32_partitioned_groups_flat) if stage3 else \
        zip(zero.bit16_groups, zero.single_partition_of_fp32_groups)
    for index, (params, master) in enumerate(groups):
        def mine(full):
            """This rank's cut of the whole tensors ``full`` (name -> tensor) of the group's parameters."""
            if stage3:  # each parameter padded to the world and cut on its own
                return torch.cat([cut(full[names[id(p)]], p.ds_tensor.ds_numel, rank, world) for p in params])
            return cut(torch.cat([full[names[id(p)]].flatten() for p in params]), master.numel(), rank, world)

        held = mine({names[id(p)]: torch.ones(p.ds_shape if stage3 else p.shape) for p in params}).bool()
        if not torch.equal(mine(states["weights"])[held], master.detach()[held]):  # padding: uninitialized
            raise CheckpointError(f"cannot reshard DeepSpeed checkpoint {folder!r}: its partition layout is not the "
                                  f"one torchstage expects; resume with the world size that wrote it")
        step = {k: v.clone() for k, v in states["exp_avg"]["step"][index].items()}
        optimizer.state[master] = {**step, "exp_avg": mine(states["exp_avg"]), "exp_avg_sq": mine(states["exp_avg_sq"])}


def cut(tensor: torch.Tensor, size: int, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s ``size`` values of ``tensor`` flattened and zero-padded to ``size x world``."""
    flat = tensor.detach().float().flatten()
    return torch.nn.functional.pad(flat, (0, size * world - flat.numel())).narrow(0, size * rank, size).clone()
