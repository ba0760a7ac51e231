"""Tensor parallelism inside a node, FSDP2 over the data-parallel ranks, pipeline stages outermost: one device mesh
``pipeline x replicate x shard x tensor``.

The user's ``parallelize(model, tensor_mesh)`` applies a tensor-parallel plan with torch's own
``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``...), and may add activation checkpointing or compile
blocks; or ``plan=`` gives the plan itself, or a transformers model brings its own (``base_model_tp_plan``). Every
plan entry must name a module and the plan must split something (:mod:`torchstage.strategies.tp_plan`). The result is
then sharded with ``fully_shard`` over the data-parallel sub-mesh, as torchtitan composes them.
The ranks of a tensor-parallel group train the same batch (the engine's ``dp_rank``, from the layout this strategy
declares), and metrics count its samples once. ``pipeline=P`` cuts the model into stages trained through a torch
pipeline schedule (:mod:`~torchstage.strategies.pipeline`); :class:`Pipeline` is its spelling without tensor
parallelism.
"""
import torch

from torchstage.distributed.layout import check_degree, complete, node_size
from torchstage.strategies.fsdp import FSDP, by_mesh
from torchstage.strategies.mesh import total_norm
from torchstage.strategies.pipeline import PipelinePlan, pipeline_norm
from torchstage.strategies.tp_plan import apply_plan, model_plan, resolve_plan, run_parallelize


class ModelParallel(FSDP):
    """``ModelParallel(tensor=T, parallelize=fn)``: each model split over ``T`` ranks of a node by ``fn(model,
    tensor_mesh)`` (which returns the model), then sharded with FSDP2 over the other dimension(s). Instead of ``fn``,
    ``plan={module name: style}`` (torch ParallelStyles, or transformers' names such as ``"colwise"``) is applied with
    ``parallelize_module``; with neither, the model's own plan (a transformers model's ``base_model_tp_plan``).

    ``pipeline=P`` (outermost, across nodes): the model cut into ``P x stages_per_rank`` stages, by its pieces'
    names where each stage begins (``split=["blocks.4"]``) or into even runs of blocks, trained through torch's
    schedule named ``schedule`` ("1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
    "ZBVZeroBubble", "DualPipeV") over ``n_microbatches`` microbatches (default: the number of stages); ``fn``
    then gets the rank's part of the model (its stages' pieces under their original names).

    ``data_shard``/``data_replicate`` lay out the data-parallel ranks (the world over ``T``): by default all of
    them shard; ``data_replicate=R`` replicates across ``R`` groups (HSDP + TP, a 3-D mesh). ``T`` must divide the
    ranks of a node (tensor parallelism talks at every layer: it belongs on the fastest links) and
    ``data_replicate x data_shard x T`` the world; both are refused before training. Other keyword arguments are
    FSDP's (``modules=``, ``min_params=``, ``reshard_after_forward=``).
    """

    name = None  # needs parallelize=: chosen as an object, never by name

    def __init__(self, tensor: int = None, parallelize=None, *, plan: dict = None, data_shard: int = None,
                 data_replicate: int = None, pipeline: int = None, schedule: str = "1F1B", n_microbatches: int = None, stages_per_rank: int = None,
                 split=None, **fsdp_options):
        for key in ("replicate", "shard"):
            if key in fsdp_options:
                raise TypeError(f"ModelParallel lays out the data-parallel ranks with data_{key}=..., not {key}=...")
        super().__init__(replicate=data_replicate, shard=data_shard, **fsdp_options)
        owner = type(self).__name__
        self.pipeline = check_degree(owner, "pipeline", pipeline) or 1
        self.tensor = check_degree(owner, "tensor", tensor, allow_none=self.pipeline > 1) or 1
        self.pipe = PipelinePlan(owner, self.pipeline, schedule, n_microbatches, stages_per_rank, split) \
            if self.pipeline > 1 else None
        if parallelize is not None and plan is not None:
            raise TypeError("ModelParallel takes parallelize=fn or plan={...}, not both: fn applies a plan of its own")
        if parallelize is None and plan is None and self.tensor == 1 and self.pipe is not None:
            parallelize = _as_is  # a pipeline alone: its stages are not split further
        if parallelize is not None and not callable(parallelize):
            raise TypeError(f"ModelParallel(parallelize=...) must be a function fn(model, tensor_mesh) -> model that "
                            f"applies the tensor-parallel plan (torch.distributed.tensor.parallel.parallelize_module), "
                            f"got {parallelize!r}")
        if plan is not None:
            resolve_plan(plan, "ModelParallel(plan=...)")  # its styles checked now, its names against the model later
        self.parallelize_fn, self.plan = parallelize, plan

    def __repr__(self) -> str:
        data = "".join(f", data_{k}={getattr(self, k)}" for k in ("replicate", "shard") if getattr(self, k) is not None)
        how = (f"parallelize={getattr(self.parallelize_fn, '__name__', '?')}" if self.parallelize_fn is not None
               else f"plan={len(self.plan)} entries" if self.plan is not None else "the model's plan")
        tensor = f"tensor={self.tensor}, {how}"
        if self.pipe is None:
            return f"{type(self).__name__}({tensor}{data})"
        pipe = (f"pipeline={self.pipeline}, schedule={self.pipe.schedule!r}, "
                f"n_microbatches={self.pipe.n_microbatches}")
        return f"{type(self).__name__}({pipe}{', ' + tensor if self.tensor > 1 else ''}{data})"

    def layout(self, world):
        """``pipeline x data_replicate x data_shard x tensor``; the tensor groups inside a node."""
        per_node = node_size(world)
        if per_node is not None and per_node % self.tensor:
            raise ValueError(f"{self.mesh_label()}: tensor={self.tensor} does not divide the {per_node} "
                             f"processes of a node; a tensor-parallel group must sit on one node (its ranks talk at "
                             f"every layer), so give a tensor degree that divides {per_node}")
        model = {"tensor": self.tensor, "pipeline": self.pipeline}
        return complete(self.mesh_label(), world.world_size, self.replicate, self.shard,
                        world.world_size // (self.tensor * self.pipeline), **model)

    def mesh_label(self) -> str:
        """``strategy=ModelParallel(tensor=2, data_shard=2)``: how a refused layout names the strategy."""
        data = "".join(f", data_{k}={getattr(self, k)}" for k in ("replicate", "shard") if getattr(self, k) is not None)
        if self.pipe is None:
            return f"strategy={type(self).__name__}(tensor={self.tensor}{data})"
        tensor = f", tensor={self.tensor}" if self.tensor > 1 else ""
        return f"strategy={type(self).__name__}(pipeline={self.pipeline}{tensor}{data})"

    def needs_mesh(self) -> bool:
        """Always: the tensor dimension is a sub-mesh of its own, even with one data-parallel rank."""
        return True

    @property
    def tensor_mesh(self):
        """The 1-D sub-mesh of this rank's tensor-parallel group."""
        return self.mesh["tensor"]

    def parallelize(self, model):
        """``parallelize(model, tensor_mesh)`` or the plan applied, checked: every entry names a module, something is
        split, a module comes back (a pipeline alone: the rank's part as it is)."""
        if not any(p.requires_grad for p in model.parameters()):
            return model
        if self.parallelize_fn is _as_is:
            return model
        if self.parallelize_fn is not None:
            return run_parallelize(self.parallelize_fn, model, self.tensor_mesh, self.mesh_label())
        plan = self.plan if self.plan is not None else model_plan(model)
        if plan is None:
            raise ValueError(f"{self.mesh_label()}: the model ({type(model).__name__}) carries no tensor-parallel "
                             f"plan (a transformers model's config.base_model_tp_plan); give ModelParallel "
                             f"parallelize=fn(model, tensor_mesh) or plan={{module name: ColwiseParallel(), ...}}")
        return apply_plan(model, self.tensor_mesh, plan, self.mesh_label())

    def describe(self) -> str:
        """The mesh, and under a pipeline its schedule."""
        mesh = super().describe()
        return mesh if self.pipe is None else f"{mesh}, {self.pipe.describe()}"

    # ---- the pipeline ------------------------------------------------------------------------
    @property
    def pipelined(self) -> bool:
        """True under a pipeline: a train batch's forward and backward run together (:meth:`pipeline_step`)."""
        return self.pipe is not None

    def setup(self, models, optimizers, plans=(), batch_size=None):
        """Without a pipeline FSDP's (after :meth:`parallelize`); with one, this rank's stages
        (:meth:`PipelinePlan.setup`)."""
        if self.pipe is None or not self.engine.is_distributed:
            return super().setup(models, optimizers, plans, batch_size)
        if self.precision.dtype is torch.float16:
            raise ValueError(f"amp='fp16' is not supported with {self.label} (it needs a sharded grad scaler); "
                             "use amp='bf16'")
        return self.pipe.setup(self, models, optimizers, plans, batch_size)

    def pipeline_step(self, model, inputs, targets, criterion, train: bool = True):
        """``(outputs, loss)`` of one batch through the schedule (forward and, when ``train``, backward): the outputs
        on the rank that counts the samples (zeros of their shape on the other stages), the batch's mean loss on
        every rank."""
        return self.pipe.step(inputs, targets, criterion, train)

    def backward(self, loss, optimizer) -> None:
        """Under a pipeline nothing: :meth:`pipeline_step` ran the backward with the forward."""
        if self.pipe is None:
            super().backward(loss, optimizer)

    def clip_grad_norm_(self, params, max_norm):
        """Clip by the norm of the whole model: over each stage's meshes, then over the pipeline's stages."""
        if self.pipe is None or self.pipe.runner is None:
            return super().clip_grad_norm_(params, max_norm)
        total = pipeline_norm(total_norm([p.grad for p in params]), self.mesh["pipeline"].get_group())
        for group in by_mesh(params).values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total


class Pipeline(ModelParallel):
    """``Pipeline(P, schedule="1F1B", n_microbatches=None)``: pipeline parallelism alone (the data-parallel ranks
    of the rest of the world shard with FSDP2); :class:`ModelParallel`'s ``pipeline=`` with its other options."""

    def __init__(self, pipeline: int = 2, schedule: str = "1F1B", n_microbatches: int = None, **options):
        if check_degree("Pipeline", "pipeline", pipeline, allow_none=False) < 2:
            raise ValueError(f"Pipeline(pipeline={pipeline}): a pipeline has at least 2 stages' ranks; without one "
                             f"use strategy='fsdp' or 'ddp'")
        super().__init__(pipeline=pipeline, schedule=schedule, n_microbatches=n_microbatches, **options)


def _as_is(model, tensor_mesh):
    return model
