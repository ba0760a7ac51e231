"""Tensor parallelism inside a node, FSDP2 over the data-parallel ranks: one device mesh
``replicate x shard x tensor``.

The user's ``parallelize(model, tensor_mesh)`` applies a tensor-parallel plan with torch's own
``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``...), and may add activation checkpointing or compile
blocks; or ``plan=`` gives the plan itself, or a transformers model brings its own (``base_model_tp_plan``). Every
plan entry must name a module and the plan must split something (:mod:`torchstage.strategies.tp_plan`). The result is
then sharded with ``fully_shard`` over the data-parallel sub-mesh, as torchtitan composes them.
The ranks of a tensor-parallel group train the same batch (the engine's ``dp_rank``, from the layout this strategy
declares), and metrics count its
samples once.
"""
from torchstage.distributed.layout import check_degree, complete, node_size
from torchstage.strategies.fsdp import FSDP
from torchstage.strategies.tp_plan import apply_plan, model_plan, resolve_plan, run_parallelize


class ModelParallel(FSDP):
    """``ModelParallel(tensor=T, parallelize=fn)``: each model split over ``T`` ranks of a node by ``fn(model,
    tensor_mesh)`` (which returns the model), then sharded with FSDP2 over the other dimension(s). Instead of ``fn``,
    ``plan={module name: style}`` (torch ParallelStyles, or transformers' names such as ``"colwise"``) is applied with
    ``parallelize_module``; with neither, the model's own plan (a transformers model's ``base_model_tp_plan``).

    ``data_shard``/``data_replicate`` lay out the data-parallel ranks (the world over ``T``): by default all of
    them shard; ``data_replicate=R`` replicates across ``R`` groups (HSDP + TP, a 3-D mesh). ``T`` must divide the
    ranks of a node (tensor parallelism talks at every layer: it belongs on the fastest links) and
    ``data_replicate x data_shard x T`` the world; both are refused before training. Other keyword arguments are
    FSDP's (``modules=``, ``min_params=``, ``reshard_after_forward=``).
    """

    name = None  # needs parallelize=: chosen as an object, never by name

    def __init__(self, tensor: int = None, parallelize=None, *, plan: dict = None, data_shard: int = None,
                 data_replicate: int = None, **fsdp_options):
        for key in ("replicate", "shard"):
            if key in fsdp_options:
                raise TypeError(f"ModelParallel lays out the data-parallel ranks with data_{key}=..., not {key}=...")
        super().__init__(replicate=data_replicate, shard=data_shard, **fsdp_options)
        self.tensor = check_degree("ModelParallel", "tensor", tensor, allow_none=False)
        if parallelize is not None and plan is not None:
            raise TypeError("ModelParallel takes parallelize=fn or plan={...}, not both: fn applies a plan of its own")
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
        return f"ModelParallel(tensor={self.tensor}, {how}{data})"

    def layout(self, world):
        """``data_replicate x data_shard x tensor``; the tensor groups inside a node."""
        per_node = node_size(world)
        if per_node is not None and per_node % self.tensor:
            raise ValueError(f"{self.mesh_label()}: tensor={self.tensor} does not divide the {per_node} "
                             f"processes of a node; a tensor-parallel group must sit on one node (its ranks talk at "
                             f"every layer), so give a tensor degree that divides {per_node}")
        return complete(self.mesh_label(), world.world_size, self.replicate, self.shard,
                        world.world_size // self.tensor, tensor=self.tensor)

    def mesh_label(self) -> str:
        """``strategy=ModelParallel(tensor=2, data_shard=2)``: how a refused layout names the strategy."""
        data = "".join(f", data_{k}={getattr(self, k)}" for k in ("replicate", "shard") if getattr(self, k) is not None)
        return f"strategy=ModelParallel(tensor={self.tensor}{data})"

    def needs_mesh(self) -> bool:
        """Always: the tensor dimension is a sub-mesh of its own, even with one data-parallel rank."""
        return True

    @property
    def tensor_mesh(self):
        """The 1-D sub-mesh of this rank's tensor-parallel group."""
        return self.mesh["tensor"]

    def parallelize(self, model):
        """``parallelize(model, tensor_mesh)`` or the plan applied, checked: every entry names a module, something is
        split, a module comes back."""
        if not any(p.requires_grad for p in model.parameters()):
            return model
        if self.parallelize_fn is not None:
            return run_parallelize(self.parallelize_fn, model, self.tensor_mesh, self.mesh_label())
        plan = self.plan if self.plan is not None else model_plan(model)
        if plan is None:
            raise ValueError(f"{self.mesh_label()}: the model ({type(model).__name__}) carries no tensor-parallel "
                             f"plan (a transformers model's config.base_model_tp_plan); give ModelParallel "
                             f"parallelize=fn(model, tensor_mesh) or plan={{module name: ColwiseParallel(), ...}}")
        return apply_plan(model, self.tensor_mesh, plan, self.mesh_label())
