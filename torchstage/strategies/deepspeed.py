"""DeepSpeed ZeRO (stages 1-3): each trained model in a ``DeepSpeedEngine`` that does backward and the step.

torchstage owns the schedule: DeepSpeed runs with ``managed_gradient_accumulation=False`` (the optimizer
callback decides when a group ends and calls the step) and is configured from ``train()``: the micro batch
size, ``gradient_accumulation_steps``, ``gradient_clipping`` and bf16/fp16 are filled in, and a DeepSpeed
config that says otherwise is refused before training, naming both values. The user's optimizer is
DeepSpeed's client optimizer (same object, groups and hyperparameters, so the user's scheduler keeps
stepping it). Checkpoints are directories of DeepSpeed's own files (see :mod:`torchstage.files.deepspeed_files`).
"""
import contextlib
import os
from dataclasses import replace

import torch

from torchstage.files.checkpoint_write import DeepSpeedCheckpointIO
from torchstage.files.checkpoint_format import CheckpointError
from torchstage.strategies.deepspeed_config import config_optimizer, deep_merge, engine_config, read_config
from torchstage.strategies.deepspeed_ops import op_build, quiet_other_ranks
from torchstage.strategies.deepspeed_state import load_into, safe_checkpoint_engine, set_fp32, whole_fp32
from torchstage.strategies.precision import Precision
from torchstage.strategies.base import StepPlan, Strategy

#: The one key of a model state that DeepSpeed's files hold (see :meth:`DeepSpeed.model_state_dict`).
HELD_BY = "deepspeed_engine"


class DeepSpeed(Strategy):
    """``strategy="deepspeed"``, or ``DeepSpeed(stage=1|2|3, config=..., ...)``: ZeRO over all ranks.

    ``config`` is a DeepSpeed config dict or a JSON/YAML file; ``overrides`` are top-level config keys laid
    over it. ``stage`` (default: the config's, else 2) shards optimizer state (1), also gradients (2), also
    parameters (3). ``offload_optimizer`` keeps optimizer state in CPU memory; ``offload_params`` (stage 3)
    the parameters too. Needs several processes and ``pip install torchstage[deepspeed]``.
    """

    name = "deepspeed"
    no_snapshots = ("its engine keeps the optimizer's state (fp32 master weights, ZeRO partitions, loss scale) where "
                    "a copy of the model's and optimizer's tensors cannot put it back")

    def __init__(self, stage: int = None, config=None, offload_optimizer: bool = False, offload_params: bool = False,
                 **overrides):
        config = deep_merge(read_config(config), overrides)
        zero = config.setdefault("zero_optimization", {})
        if not isinstance(zero, dict):
            raise TypeError(f"DeepSpeed config zero_optimization must be a dict, got {zero!r}")
        if stage is not None and (isinstance(stage, bool) or stage not in (1, 2, 3)):
            raise ValueError(f"DeepSpeed(stage=...) must be 1, 2 or 3 (ZeRO stage), got {stage!r}")
        if stage is not None and zero.get("stage", stage) != stage:
            raise ValueError(f"DeepSpeed(stage={stage}) disagrees with the config's zero_optimization.stage="
                             f"{zero['stage']!r}; set the stage in one place")
        zero["stage"] = stage = zero.get("stage", 2 if stage is None else stage)
        if stage not in (1, 2, 3):
            raise ValueError(f"DeepSpeed config zero_optimization.stage must be 1, 2 or 3, got {stage!r} (stage 0 "
                             f"is plain data parallelism: use strategy='ddp')")
        for flag, value in (("offload_optimizer", offload_optimizer), ("offload_params", offload_params)):
            if not isinstance(value, bool):
                raise TypeError(f"DeepSpeed({flag}=...) must be True or False, got {value!r}")
        if offload_params and stage != 3:
            raise ValueError(f"DeepSpeed(offload_params=True) needs stage=3 (only ZeRO-3 partitions parameters), "
                             f"got stage={stage}")
        if offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", **zero.get("offload_optimizer", {})}
            config.setdefault("zero_force_ds_cpu_optimizer", False)  # the user's torch optimizer steps on the CPU
        if offload_params:
            zero["offload_param"] = {"device": "cpu", **zero.get("offload_param", {})}
        if "scheduler" in config:
            raise ValueError(f"DeepSpeed config scheduler {config['scheduler'].get('type')!r}: torchstage steps the "
                             f"scheduler given to train(scheduler=...); build it there (e.g. torch.optim.lr_scheduler."
                             f"LambdaLR for a warmup) and remove 'scheduler' from the config")
        if config.get("managed_gradient_accumulation", False):
            raise ValueError("DeepSpeed config managed_gradient_accumulation=True: torchstage decides when an "
                             "accumulation group ends (train(accumulation_steps=...)); remove the key")
        #: the config names an optimizer: setup builds it for a run given none
        self.supplies_optimizer = config_optimizer(config) is not None  # a type it cannot build fails now
        self.config, self.stage = config, stage
        self._engines, self._pending, self._dtypes, self._plans = {}, {}, {}, {}

    def __repr__(self) -> str:
        return f"DeepSpeed(stage={self.stage})"

    #: DeepSpeed partitions real tensors (ZeRO-3 builds its partitions inside ``deepspeed.zero.Init()``), so it
    #: cannot start from a model torch built on the meta device.
    meta_refusal = ("DeepSpeed partitions real tensors: ZeRO-3 builds a model too large for one process inside "
                    "deepspeed.zero.Init(config_dict_or_path=...), never from torch's meta device; build it there, or "
                    "use strategy='fsdp' (or HSDP, ModelParallel), which materialises a meta model shard by shard")

    # ---- the lifecycle -----------------------------------------------------------------------
    def layout(self, world):
        """Every rank a data-parallel one (ZeRO partitions the state over all of them); refused for one process."""
        if world.world_size == 1:
            raise ValueError("strategy='deepspeed' shards training state over several processes, and this run has "
                             "one; use distributed=True with nprocs >= 2 (or torchrun), or strategy='ddp' (which also "
                             "continues a ZeRO checkpoint: resume=... consolidates its partitions)")
        return super().layout(world)

    def connect(self, engine, amp=None) -> None:
        """Import DeepSpeed for ``engine``'s device; DeepSpeed scales float16 losses itself: no grad scaler here."""
        if engine.device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed reads it once, on import
        accelerator = _import_deepspeed().accelerator.get_accelerator().device_name()
        if accelerator != engine.device.type:
            raise ValueError(f"strategy='deepspeed': DeepSpeed's accelerator is {accelerator!r} but this run trains "
                             f"on {engine.device}; set DS_ACCELERATOR={engine.device.type} before starting")
        super().connect(engine, amp)
        self.precision = Precision(self.precision.dtype, None, self.precision.device_type)
        self._world_size = engine.world_size
        quiet_other_ranks(engine)
        self.checkpoint_io = DeepSpeedCheckpointIO(engine, self._engines)

    def engine_config(self, plan, batch_size, world_size: int) -> dict:
        """The DeepSpeed config of one engine: the strategy's, with what ``train()`` owns (the train loaders'
        ``batch_size``, the :class:`StepPlan` of its optimizer) filled in or checked."""
        return engine_config(self.config, self.precision.dtype, batch_size, plan, world_size)

    def setup(self, models, optimizers, plans=(), batch_size=None):
        """One DeepSpeedEngine per trained model, with its own optimizer (the config's, built here for a run given
        none); a pending checkpoint is loaded into it. The engines stand in for the trained models."""
        compiled = [key for key, model in models.items() if hasattr(model, "_orig_mod")]
        if compiled:
            raise ValueError(f"compile=True is not supported with strategy='deepspeed' (model {compiled[0]!r} is "
                             f"compiled before DeepSpeed wraps it); train without compile, or use strategy='ddp'")
        for plan in plans:
            if plan.grad_clip_value is not None:
                raise ValueError(f"grad_clip_value={plan.grad_clip_value} is not supported with strategy='deepspeed' "
                                 f"(DeepSpeed clips the total norm only); use grad_clip_norm=...")
        optimizers = list(optimizers)
        if self.supplies_optimizer:
            if optimizers:
                raise ValueError(f"an optimizer was given twice: train(optimizer={type(optimizers[0]).__name__}) and "
                                 f"DeepSpeed config optimizer {self.config['optimizer'].get('type')!r}; keep one of them")
            optimizers = [self._config_optimizer(models)]
            plans = [replace(plan, optimizer=optimizers[0]) if plan.optimizer is None else plan for plan in plans]
        self._plans = {id(plan.optimizer): plan for plan in plans}
        deepspeed = _import_deepspeed()
        wrapped = dict(models)
        for name, model in models.items():
            if not any(p.requires_grad for p in model.parameters()):
                continue
            optimizer = _optimizer_of(name, model, optimizers)
            # no stepping callback for it: a handle_batch calls backward and the step itself, one batch per step
            plan = self._plans.get(id(optimizer)) or StepPlan(optimizer)
            self._dtypes[name] = {key: t.dtype for key, t in [*model.named_parameters(), *model.named_buffers()]}
            with op_build(deepspeed, self.engine):  # built on first use: said once, by the main rank
                ds_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                     config=self.engine_config(plan, batch_size,
                                                                               self.engine.world_size),
                                                     dist_init_required=False)
            ds_engine.checkpoint_engine = safe_checkpoint_engine(ds_engine._config)
            self._engines[name] = ds_engine
            if id(optimizer) in self._pending:
                load_into(ds_engine, optimizer, *self._pending.pop(id(optimizer)))
            wrapped[name] = ds_engine
        return wrapped, optimizers

    def _config_optimizer(self, models: dict):
        """The optimizer of the config's ``optimizer`` section for the run's one model."""
        kind = config_optimizer(self.config)
        if len(models) > 1:
            raise ValueError(f"DeepSpeed config optimizer {kind!r} with several models {sorted(models)}: give each "
                             f"model its optimizer in train(optimizer={{name: ...}}) instead")
        params = dict(self.config["optimizer"].get("params", {}))
        if kind == "Adam" and params.pop("adam_w_mode", True):
            kind = "AdamW"  # DeepSpeed's "Adam" decouples weight decay unless adam_w_mode is false
        params.pop("torch_adam", None)
        return getattr(torch.optim, kind)(next(iter(models.values())).parameters(), **params)

    def teardown(self, complete: bool = True) -> None:
        """Destroy each engine (its ZeRO hooks and buffers) while the process group it uses still exists. After a
        complete run the models first get their whole fp32 weights (the master copy) and original dtypes back,
        so they work on after ``train()`` as with any other strategy (collective); after a failure nothing waits
        for the other ranks."""
        super().teardown(complete)
        deepspeed = _import_deepspeed()
        for name, ds_engine in self._engines.items():
            module, dtypes = ds_engine.module, self._dtypes.pop(name)
            params = list(module.named_parameters())
            whole = [whole_fp32(deepspeed, p, self.stage) for _, p in params] if complete else []
            ds_engine.destroy()
            if not complete:
                continue
            for (key, param), data in zip(params, whole):
                param.data = data.to(dtypes[key])
            for key, buffer in list(module.named_buffers()):
                owner, _, leaf = key.rpartition(".")
                module.get_submodule(owner)._buffers[leaf] = buffer.to(dtypes[key])
        self._engines.clear()

    def _find_engine(self, optimizer):
        """The DeepSpeedEngine stepping ``optimizer`` (None: none of this run does, yet)."""
        for ds_engine in self._engines.values():
            if ds_engine.optimizer is optimizer or getattr(ds_engine.optimizer, "optimizer", None) is optimizer:
                return ds_engine
        return None

    def _engine_of(self, optimizer):
        ds_engine = self._find_engine(optimizer)
        if ds_engine is not None:
            return ds_engine
        raise RuntimeError(f"strategy='deepspeed': the optimizer {type(optimizer).__name__} belongs to no DeepSpeed "
                           f"engine of this run")

    # ---- the step ----------------------------------------------------------------------------
    def backward(self, loss, optimizer) -> None:
        """DeepSpeed's backward (its loss scaling and ZeRO gradient partitioning); the callback divided the loss."""
        engine = self._engine_of(optimizer)
        if self.stage > 1 and len(self._engines) > 1:
            _check_reaches_only(loss, engine, self._engines)
        engine.backward(loss, scale_wrt_gas=False)

    def no_sync(self, model):
        """A no-op: with torchstage owning the accumulation boundary, DeepSpeed reduces when it steps."""
        return contextlib.nullcontext()

    def finish_partial_group(self, optimizer, scale):
        if scale != 1:
            raise RuntimeError("strategy='deepspeed' with accumulation_steps > 1 needs loaders with a length: the last "
                               "accumulation group of a loader ended early, and DeepSpeed has already reduced its "
                               "gradients; give the loader a __len__ or use accumulation_steps=1")

    def clip_gradients(self, optimizer, max_norm=None, max_value=None) -> None:
        """Nothing here: DeepSpeed clips inside its step by the config's gradient_clipping (train's grad_clip_norm)."""

    def optimizer_step(self, optimizer) -> None:
        """DeepSpeed's step: reduce, clip, update the partitions, gather the parameters, reset the gradients."""
        self._engine_of(optimizer).step()

    def zero_grad(self, optimizer) -> None:
        self._engine_of(optimizer).optimizer.zero_grad()

    # ---- checkpoint state --------------------------------------------------------------------
    def _tag_of(self, model):
        return next((name for name, e in self._engines.items() if e.module is model), None)

    def model_state_dict(self, model) -> dict:
        """For a model in a DeepSpeed engine, a note naming it (its weights go into DeepSpeed's files, and a loaded
        checkpoint holds them consolidated), else the plain state."""
        name = self._tag_of(model)
        return {HELD_BY: name} if name is not None else model.state_dict()

    def load_model_state_dict(self, model, state) -> None:
        """Full weights into a plain model, or into a trained engine's model (its fp32 master partitions too, so
        that nothing is rounded through bf16); the note of :meth:`model_state_dict` (an unsaved state of this
        run) leaves the engine's weights as they are."""
        name = self._tag_of(model)
        if list(state) == [HELD_BY] and state[HELD_BY] == name:
            return None
        if name is None:
            return model.load_state_dict(state)
        deepspeed = _import_deepspeed()
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0, enabled=self.stage == 3):
            model.load_state_dict(state)
        for key, param in model.named_parameters():
            if param.requires_grad:
                set_fp32(deepspeed, param, state[key].float(), self.stage, self._world_size)
        return None

    def optimizer_state_dict(self, optimizer, models) -> dict:
        """The hyperparameters of each group and where DeepSpeed's files hold the state (the model's name)."""
        engine = self._engine_of(optimizer)
        groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": []}
                  for group in optimizer.param_groups]
        return {"state": {}, "param_groups": groups,
                "deepspeed": {"tag": self._tag_of(engine.module), "world_size": self._world_size, "stage": self.stage}}

    @classmethod
    def load_saved_optimizer_state(cls, optimizer, models, state) -> bool:
        """A DeepSpeed checkpoint's optimizer state into a plain optimizer (any other strategy, one process too):
        each parameter's state consolidated from its ZeRO partitions first."""
        if "deepspeed" not in state:
            return False
        from torchstage.files.deepspeed_files import plain_optimizer_state  # DeepSpeed checkpoints only
        optimizer.load_state_dict(plain_optimizer_state(state, optimizer, models))
        return True

    def load_optimizer_state_dict(self, optimizer, models, state) -> None:
        """Keep where the checkpoint's DeepSpeed files are; they load into the engine once it exists (at once when it
        does: an optimizer the config names is made by :meth:`setup`)."""
        saved = state.get("deepspeed")
        if saved is None or "path" not in saved:
            raise CheckpointError("strategy='deepspeed' resumes only a checkpoint written under DeepSpeed; this one "
                                  "holds a plain optimizer state. Start from its weights instead "
                                  "(torchstage.load_model_weights) with a new logdir")
        resharded = saved["world_size"] != self._world_size
        if saved["stage"] != self.stage:
            raise CheckpointError(f"DeepSpeed checkpoint {saved['path']!r} was written at ZeRO stage {saved['stage']} "
                                  f"and is resumed at stage {self.stage}; resume it at stage {saved['stage']}")
        for group, kept in zip(optimizer.param_groups, state["param_groups"]):
            group.update({k: v for k, v in kept.items() if k != "params"})
        pending = (saved["path"], saved["tag"], resharded)
        ds_engine = self._find_engine(optimizer)
        if ds_engine is not None:
            load_into(ds_engine, optimizer, *pending)
        else:
            self._pending[id(optimizer)] = pending


def _import_deepspeed():
    try:
        import deepspeed  # heavy, optional: DeepSpeed runs only
    except ImportError as e:
        raise ImportError(f"strategy='deepspeed' needs the deepspeed package ({e}); install it with "
                          f"pip install torchstage[deepspeed]") from None
    return deepspeed


def _optimizer_of(name: str, model, optimizers):
    """The one optimizer holding ``model``'s trainable parameters, and only them."""
    params = {id(p) for p in model.parameters()}
    mine = [o for o in optimizers if any(id(p) in params for g in o.param_groups for p in g["params"])]
    if len(mine) != 1:
        raise ValueError(f"strategy='deepspeed' gives each trained model its own optimizer; model {name!r} is "
                         f"trained by {len(mine)} optimizers")
    stray = [p for g in mine[0].param_groups for p in g["params"] if id(p) not in params]
    if stray:
        raise ValueError(f"the optimizer of model {name!r} also holds a parameter of shape {tuple(stray[0].shape)} "
                         f"that is not in it; under strategy='deepspeed' an optimizer steps one model")
    return mine[0]


def _check_reaches_only(loss, engine, engines: dict) -> None:
    """Refuse a loss whose backward would give gradients to another engine's parameters (a GAN's discriminator in
    the generator's loss): ZeRO 2 and 3 reduce gradients inside backward, and a parameter's second gradient before
    its own step fails inside DeepSpeed."""
    others = {id(p): name for name, e in engines.items() if e is not engine for p in e.module.parameters()}
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) in others:
            raise ValueError(f"strategy='deepspeed' stage {engine.zero_optimization_stage()}: this loss backpropagates "
                             f"into model {others[id(variable)]!r}, which another optimizer steps; ZeRO 2 and 3 reduce "
                             f"gradients inside backward and cannot discard them. Freeze that model during this loss's "
                             f"forward ({others[id(variable)]}.requires_grad_(False)), or use DeepSpeed(stage=1)")
        todo.extend(next_node for next_node, _ in node.next_functions)


