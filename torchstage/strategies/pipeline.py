"""Pipeline parallelism inside :class:`~torchstage.strategies.model_parallel.ModelParallel`: the model cut into
stages by its pieces (:mod:`~torchstage.strategies.pipeline_split`), each rank's stages tensor-parallel and sharded
like any model of the mesh, and trained through torch's schedules (:mod:`~torchstage.strategies.pipeline_schedule`).

``pipeline`` is the outermost dimension of the mesh: a pipeline's ranks read the same batch (the data-parallel
coordinate leaves it out) and its last stage counts the samples. The rank's model is a
:class:`~torchstage.strategies.pipeline_split.Part` holding its stages' pieces under their original names, so
checkpoints (DCP directories, as FSDP's) load at any pipeline depth.
"""
import numbers

import torch

from torchstage.strategies.fsdp import _check_optimizers, clean_name
from torchstage.strategies.pipeline_schedule import V_SHAPED, PipelineRunner, is_multi, local_stages, schedule_class
from torchstage.strategies.pipeline_split import rank_part, split, stage_parts


class PipelinePlan:
    """What ``pipeline=P, schedule=..., n_microbatches=..., stages_per_rank=..., split=...`` ask, checked when given;
    :meth:`setup` makes this rank's stages and schedule."""

    def __init__(self, owner: str, pipeline: int, schedule="1F1B", n_microbatches=None, stages_per_rank=None,
                 split_at=None):
        self.owner, self.size = owner, pipeline
        self.cls = schedule_class(schedule, owner)
        self.schedule = schedule
        if self.cls.__name__ in V_SHAPED:
            raise ValueError(f"{owner}(schedule={schedule!r}): torch's V-shaped schedules cannot run forward only, so "
                             f"validation cannot go through them (measured with torch 2.13: 'can't steal_bwd_input'); "
                             f"use 'InterleavedZeroBubble' or 'Interleaved1F1B'")
        multi = is_multi(self.cls)
        if stages_per_rank is None:
            stages_per_rank = 2 if multi else 1
        if isinstance(stages_per_rank, bool) or not isinstance(stages_per_rank, numbers.Integral) or \
                stages_per_rank < 1:
            raise ValueError(f"{owner}(stages_per_rank=...) must be an integer >= 1, got {stages_per_rank!r}")
        if not multi and stages_per_rank != 1:
            raise ValueError(f"{owner}(stages_per_rank={stages_per_rank}) does not fit schedule={schedule!r}, which "
                             f"runs 1 stage per rank; use a looped schedule ('Interleaved1F1B') for more")
        self.per_rank = int(stages_per_rank)
        self.n_stages = self.size * self.per_rank
        if n_microbatches is None:
            n_microbatches = self.n_stages
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, numbers.Integral) or n_microbatches < 1:
            raise ValueError(f"{owner}(n_microbatches=...) must be an integer >= 1, got {n_microbatches!r}")
        self.n_microbatches = int(n_microbatches)
        if split_at is not None and (isinstance(split_at, str) or not all(isinstance(n, str) for n in split_at)):
            raise ValueError(f"{owner}(split=...) must be a list of the {self.n_stages - 1} piece names where stages "
                             f"2 to {self.n_stages} begin (e.g. ['blocks.4']), got {split_at!r}")
        self.split_at = None if split_at is None else list(split_at)
        self.runner = None

    def describe(self) -> str:
        return (f"schedule {self.cls.__name__[len('Schedule'):]}, {self.n_stages} stages, "
                f"{self.n_microbatches} microbatches")

    def part_of(self, model, coordinate: int):
        """The part of ``model`` pipeline rank ``coordinate`` holds (its stages' pieces, original names): what
        :meth:`setup` trains there and the memory plan weighs."""
        return rank_part(split(model, self.n_stages, self.split_at),
                         local_stages(self.cls, coordinate, self.size, self.per_rank))

    def setup(self, strategy, models: dict, optimizers: list, plans, batch_size):
        """This rank's stages of the one trainable model (tensor-parallel and sharded as ``strategy`` does), the
        optimizers keeping only their parameters, and the schedule, checked against ``batch_size``."""
        trainable = [key for key, model in models.items() if any(p.requires_grad for p in model.parameters())]
        if len(trainable) != 1 or len(models) != 1:
            raise ValueError(f"{self.owner}: a pipeline trains one model, got {len(models)} ({list(models)})")
        deep = [plan.accumulation_steps for plan in plans if plan.accumulation_steps > 1]
        if deep:
            raise ValueError(f"{self.owner}: accumulation_steps={deep[0]} with a pipeline; a pipeline accumulates "
                             f"over its microbatches: give n_microbatches x batch_size instead, with "
                             f"accumulation_steps=1")
        if "ZeroBubble" in self.cls.__name__ and strategy.engine.dp_size > 1:
            raise ValueError(f"{self.owner}(schedule={self.schedule!r}) with {strategy.engine.dp_size} data-parallel "
                             f"ranks: its split backward and FSDP's gradient reduction give wrong gradients (measured "
                             f"with torch 2.13: 0.05 from DDP after 2 epochs, exact without data parallelism); use "
                             f"'Interleaved1F1B', or no data-parallel ranks")
        _check_optimizers(models, optimizers, strategy.label)
        key = trainable[0]
        model, engine = models[key], strategy.engine
        stages = split(model, self.n_stages, self.split_at)
        local = local_stages(self.cls, engine.coordinates["pipeline"], self.size, self.per_rank)
        before = {id(p): clean_name(name) for name, p in model.named_parameters()}
        part = rank_part(stages, local)
        parts = stage_parts(stages, local)
        if strategy.tensor > 1:
            strategy.parallelize(part)
        if engine.dp_size > 1:
            strategy.shard_models(dict(enumerate(parts)), strategy.precision.dtype)
        after = {clean_name(name): p for name, p in part.named_parameters()}
        for optimizer in optimizers:
            _rebind_local(optimizer, {old: after[name] for old, name in before.items() if name in after})
        group = strategy.mesh["pipeline"].get_group()
        self.runner = PipelineRunner(self.cls, parts, local, self.n_stages, self.n_microbatches, group,
                                     engine.device, self.owner)
        self.runner.check(batch_size)
        return {key: part}, optimizers

    def step(self, inputs, targets, criterion, train: bool):
        return self.runner.step(inputs, targets, criterion, train)


def _rebind_local(optimizer, new: dict) -> None:
    """Point ``optimizer`` at this rank's parameters (``new``: id of the model's -> the stage's, maybe sharded or
    tensor-parallel), its state sharded alike; the parameters of other stages (not in ``new``) leave it."""
    from torch.distributed.tensor import DTensor, distribute_tensor  # heavy; pipelines only
    state = optimizer.state
    for group in optimizer.param_groups:
        params = []
        for old in group["params"]:
            param = new.get(id(old))
            moved = state.pop(old, None)
            if param is None:
                continue
            if moved is not None:
                state[param] = {k: distribute_tensor(v, param.device_mesh, param.placements, src_data_rank=None)
                                if isinstance(param, DTensor) and torch.is_tensor(v) and v.shape == old.shape and
                                v.dim() > 0 else v for k, v in moved.items()}
            params.append(param)
        group["params"] = params


def pipeline_norm(total: torch.Tensor, group) -> torch.Tensor:
    """The 2-norm over every stage of a pipeline from each stage's ``total`` (its own gradients' norm)."""
    import torch.distributed as dist
    squared = total.double() ** 2
    dist.all_reduce(squared, group=group)
    return squared.sqrt().to(total.dtype)
