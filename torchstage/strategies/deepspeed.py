"""DeepSpeed ZeRO (stages 1-3): each trained model in a ``DeepSpeedEngine`` that does backward and the step.

torchstage owns the schedule: DeepSpeed runs with ``managed_gradient_accumulation=False`` (the optimizer
callback decides when a group ends and calls the step) and is configured from ``train()``: the micro batch
size, ``gradient_accumulation_steps``, ``gradient_clipping`` and bf16/fp16 are filled in, and a DeepSpeed
config that says otherwise is refused before training, naming both values. The user's optimizer is
DeepSpeed's client optimizer (same object, groups and hyperparameters, so the user's scheduler keeps
stepping it). Checkpoints are directories of DeepSpeed's own files (see :mod:`torchstage.files.deepspeed_files`).
"""
import contextlib
import copy
import json
import numbers
import os

import torch

from torchstage.files.format import CheckpointError
from torchstage.strategies.precision import Precision
from torchstage.strategies.single import SingleDevice, StepPlan

#: The one key of a model state that DeepSpeed's files hold (see :meth:`DeepSpeed.model_state_dict`).
HELD_BY = "deepspeed_engine"
#: What ``DeepSpeed(config={"optimizer": {"type": ...}})`` builds, as DeepSpeed does with ``torch_adam: true``.
CONFIG_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


class DeepSpeed(SingleDevice):
    """``strategy="deepspeed"``, or ``DeepSpeed(stage=1|2|3, config=..., ...)``: ZeRO over all ranks.

    ``config`` is a DeepSpeed config dict or a JSON/YAML file; ``overrides`` are top-level config keys laid
    over it. ``stage`` (default: the config's, else 2) shards optimizer state (1), also gradients (2), also
    parameters (3). ``offload_optimizer`` keeps optimizer state in CPU memory; ``offload_params`` (stage 3)
    the parameters too. Needs several processes and ``pip install torchstage[deepspeed]``.
    """

    name = "deepspeed"

    def __init__(self, stage: int = None, config=None, offload_optimizer: bool = False, offload_params: bool = False,
                 **overrides):
        config = _deep_merge(_read_config(config), overrides)
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
        _config_optimizer(config)  # a type it cannot build fails now
        self.config, self.stage = config, stage
        self._engines, self._made, self._pending, self._dtypes = {}, {}, {}, {}
        self._plans, self._batch_size = {}, None

    def __repr__(self) -> str:
        return f"DeepSpeed(stage={self.stage})"

    # ---- before training ---------------------------------------------------------------------
    def setup(self, engine, amp=None) -> None:
        """Import DeepSpeed for ``engine``'s device; DeepSpeed scales float16 losses itself: no grad scaler here."""
        if not engine.is_distributed:
            raise ValueError("strategy='deepspeed' shards training state over several processes, and this run has "
                             "one; use distributed=True with nprocs >= 2 (or torchrun), or strategy='ddp'")
        if engine.device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed reads it once, on import
        accelerator = _import_deepspeed().accelerator.get_accelerator().device_name()
        if accelerator != engine.device.type:
            raise ValueError(f"strategy='deepspeed': DeepSpeed's accelerator is {accelerator!r} but this run trains "
                             f"on {engine.device}; set DS_ACCELERATOR={engine.device.type} before starting")
        precision = Precision.for_device(amp, engine.device, engine.is_main)
        self.precision = Precision(precision.dtype, None, precision.device_type)
        self._world_size = engine.world_size
        self._snapshot_buffers = {}

    def make_optimizer(self, model):
        """The optimizer of the config's ``optimizer`` section for ``model`` (None without one)."""
        kind = _config_optimizer(self.config)
        if kind is None:
            return None
        if isinstance(model, dict):
            raise ValueError(f"DeepSpeed config optimizer {kind!r} with several models {sorted(model)}: give each "
                             f"model its optimizer in train(optimizer={{name: ...}}) instead")
        key = id(model)
        if key not in self._made:
            params = dict(self.config["optimizer"].get("params", {}))
            if kind == "Adam" and params.pop("adam_w_mode", True):
                kind = "AdamW"  # DeepSpeed's "Adam" decouples weight decay unless adam_w_mode is false
            params.pop("torch_adam", None)
            self._made[key] = getattr(torch.optim, kind)(model.parameters(), **params)
        return self._made[key]

    def plan_steps(self, batch_size, steps) -> None:
        """The train loaders' batch size and each optimizer's schedule (:class:`StepPlan`), before wrapping."""
        for step in steps:
            if step.grad_clip_value is not None:
                raise ValueError(f"grad_clip_value={step.grad_clip_value} is not supported with strategy='deepspeed' "
                                 f"(DeepSpeed clips the total norm only); use grad_clip_norm=...")
            self._plans[id(step.optimizer)] = step
        self._batch_size = batch_size

    def engine_config(self, plan, world_size: int) -> dict:
        """The DeepSpeed config of one engine: the strategy's, with what ``train()`` owns filled in or checked."""
        config = copy.deepcopy(self.config)
        config.pop("optimizer", None)  # built by make_optimizer: every engine gets a client optimizer
        clip = plan.grad_clip_norm
        _agree(config, "train_micro_batch_size_per_gpu", self._batch_size,
               f"the train loader's batch_size ({self._batch_size})")
        _agree(config, "gradient_accumulation_steps", plan.accumulation_steps,
               f"train(accumulation_steps={plan.accumulation_steps})")
        _agree(config, "gradient_clipping", float(clip or 0.0), f"train(grad_clip_norm={clip})"
               + ("" if clip else " (no clipping; DeepSpeed's own default is 1.0)"))
        dtype = self.precision.dtype
        for key, ours in (("bf16", dtype is torch.bfloat16), ("fp16", dtype is torch.float16)):
            given = bool(config.get(key, {}).get("enabled", False))
            if key in config and given != ours:
                amp = {torch.bfloat16: "'bf16'", torch.float16: "'fp16'"}.get(dtype, "None")
                raise ValueError(f"DeepSpeed config {key}.enabled={given} disagrees with train(amp={amp}); set the "
                                 f"precision in one place")
            if ours:
                config[key] = {**config.get(key, {}), "enabled": True}
        expected = config["train_micro_batch_size_per_gpu"] * plan.accumulation_steps * world_size
        _agree(config, "train_batch_size", expected,
               f"batch_size x accumulation_steps x {world_size} processes ({expected})")
        config.update(managed_gradient_accumulation=False, zero_allow_untested_optimizer=True)
        config.setdefault("steps_per_print", 2 ** 62)
        return config

    # ---- wrapping ----------------------------------------------------------------------------
    def wrap_models(self, models, engine, optimizers=()):
        """One DeepSpeedEngine per trained model, with its own optimizer; a pending checkpoint is loaded into it."""
        compiled = [key for key, model in models.items() if hasattr(model, "_orig_mod")]
        if compiled:
            raise ValueError(f"compile=True is not supported with strategy='deepspeed' (model {compiled[0]!r} is "
                             f"compiled before DeepSpeed wraps it); train without compile, or use strategy='ddp'")
        deepspeed = _import_deepspeed()
        given = [o for o in optimizers if id(o) not in {id(m) for m in self._made.values()}]
        if given and _config_optimizer(self.config):
            raise ValueError(f"an optimizer was given twice: train(optimizer={type(given[0]).__name__}) and DeepSpeed "
                             f"config optimizer {self.config['optimizer'].get('type')!r}; keep one of them")
        wrapped = dict(models)
        for name, model in models.items():
            if not any(p.requires_grad for p in model.parameters()):
                continue
            optimizer = _optimizer_of(name, model, optimizers)
            # no OptimizerCallback for it: a handle_batch calls backward and the step itself, one batch per step
            plan = self._plans.get(id(optimizer)) or StepPlan(optimizer)
            self._dtypes[name] = {key: t.dtype for key, t in [*model.named_parameters(), *model.named_buffers()]}
            ds_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                 config=self.engine_config(plan, engine.world_size),
                                                 dist_init_required=False)
            ds_engine.checkpoint_engine = _safe_checkpoint_engine(ds_engine._config)
            self._engines[name] = ds_engine
            if id(optimizer) in self._pending:
                _load_into(ds_engine, optimizer, *self._pending.pop(id(optimizer)))
            wrapped[name] = ds_engine
        return wrapped

    def teardown(self, complete: bool = True) -> None:
        """Destroy each engine (its ZeRO hooks and buffers) while the process group it uses still exists. After a
        complete run the models first get their whole fp32 weights (the master copy) and original dtypes back,
        so they work on after ``train()`` as with any other strategy (collective); after a failure nothing waits
        for the other ranks."""
        deepspeed = _import_deepspeed()
        for name, ds_engine in self._engines.items():
            module, dtypes = ds_engine.module, self._dtypes.pop(name)
            params = list(module.named_parameters())
            whole = [_whole_fp32(deepspeed, p, self.stage) for _, p in params] if complete else []
            ds_engine.destroy()
            if not complete:
                continue
            for (key, param), data in zip(params, whole):
                param.data = data.to(dtypes[key])
            for key, buffer in list(module.named_buffers()):
                owner, _, leaf = key.rpartition(".")
                module.get_submodule(owner)._buffers[leaf] = buffer.to(dtypes[key])
        self._engines.clear()

    def _engine_of(self, optimizer):
        for ds_engine in self._engines.values():
            if ds_engine.optimizer is optimizer or getattr(ds_engine.optimizer, "optimizer", None) is optimizer:
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

    def finish_partial_group(self, optimizer, engine, scale):
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
                _set_fp32(deepspeed, param, state[key].float(), self.stage, self._world_size)
        return None

    def optimizer_state_dict(self, optimizer, models) -> dict:
        """The hyperparameters of each group and where DeepSpeed's files hold the state (the model's name)."""
        engine = self._engine_of(optimizer)
        groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": []}
                  for group in optimizer.param_groups]
        return {"state": {}, "param_groups": groups,
                "deepspeed": {"tag": self._tag_of(engine.module), "world_size": self._world_size, "stage": self.stage}}

    def load_optimizer_state_dict(self, optimizer, models, state) -> None:
        """Keep where the checkpoint's DeepSpeed files are; they load into the engine once it exists."""
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
        self._pending[id(optimizer)] = (saved["path"], saved["tag"], resharded)

    def save_checkpoint(self, checkpoint, paths, engine, writer=None, before_last=None) -> None:
        """Every rank writes its DeepSpeed files into a new directory, the main rank the rest of the run's state;
        then the names in ``paths`` are switched to it in order (collective). Waits for earlier file jobs."""
        from torchstage.files.checkpoint import snapshot
        from torchstage.files.deepspeed_files import save_deepspeed
        if writer is not None:
            writer.wait()
        state = snapshot(checkpoint) if engine.is_main else None
        save_deepspeed(state, self._engines, paths, engine, before_last)


def _import_deepspeed():
    try:
        import deepspeed  # heavy, optional: DeepSpeed runs only
    except ImportError as e:
        raise ImportError(f"strategy='deepspeed' needs the deepspeed package ({e}); install it with "
                          f"pip install torchstage[deepspeed]") from None
    return deepspeed


def _read_config(config) -> dict:
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


def _deep_merge(base: dict, over: dict) -> dict:
    for key, value in over.items():
        base[key] = _deep_merge(base.get(key, {}), value) if isinstance(value, dict) and isinstance(
            base.get(key), dict) else value
    return base


def _config_optimizer(config: dict):
    """The torch optimizer class name the config's ``optimizer`` section asks for (None without one)."""
    section = config.get("optimizer")
    if section is None:
        return None
    kind = str(section.get("type", "")).lower()
    if kind not in CONFIG_OPTIMIZERS:
        raise ValueError(f"DeepSpeed config optimizer type {section.get('type')!r} cannot be built by torchstage (it "
                         f"builds {sorted(CONFIG_OPTIMIZERS.values())}); pass your optimizer to train(optimizer=...)")
    return CONFIG_OPTIMIZERS[kind]


def _agree(config: dict, key: str, ours, what: str) -> None:
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


def _whole_fp32(deepspeed, param, stage: int) -> torch.Tensor:
    """A parameter's whole value: its fp32 master copy, or for a frozen one the (gathered) parameter itself."""
    data = deepspeed.utils.safe_get_full_fp32_param(param)
    if data is None:
        with deepspeed.zero.GatheredParameters([param], enabled=stage == 3):
            data = param.data.clone()
    return data.detach().clone()


def _set_fp32(deepspeed, param, value: torch.Tensor, stage: int, world_size: int) -> None:
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


def _safe_checkpoint_engine(config):
    """DeepSpeed's torch checkpoint engine, loading its files with weights_only=True (see ``safe_load``)."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from torchstage.files.deepspeed_files import safe_load

    class SafeCheckpointEngine(TorchCheckpointEngine):
        def load(self, path, map_location=None):
            return safe_load(path, map_location=map_location)

    return SafeCheckpointEngine(config)


def _load_into(ds_engine, optimizer, path: str, tag: str, resharded: bool) -> None:
    """DeepSpeed's files of ``tag`` into the engine (weights, fp32 partitions, optimizer state), or ``resharded``
    from another world size; the group hyperparameters torchstage set (the checkpoint's, or the new ones of
    ``resume_lr='new'``) are kept."""
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    if resharded:
        _reshard_into(ds_engine, optimizer, os.path.join(path, tag))
    else:
        loaded, _ = ds_engine.load_checkpoint(path, tag=tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load its checkpoint {os.path.join(path, tag)!r}")
    for group, kept in zip(optimizer.param_groups, hyper):
        group.update(kept)


def _reshard_into(ds_engine, optimizer, folder: str) -> None:
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
                return torch.cat([_cut(full[names[id(p)]], p.ds_tensor.ds_numel, rank, world) for p in params])
            return _cut(torch.cat([full[names[id(p)]].flatten() for p in params]), master.numel(), rank, world)

        held = mine({names[id(p)]: torch.ones(p.ds_shape if stage3 else p.shape) for p in params}).bool()
        if not torch.equal(mine(states["weights"])[held], master.detach()[held]):  # padding: uninitialized
            raise CheckpointError(f"cannot reshard DeepSpeed checkpoint {folder!r}: its partition layout is not the "
                                  f"one torchstage expects; resume with the world size that wrote it")
        step = {k: v.clone() for k, v in states["exp_avg"]["step"][index].items()}
        optimizer.state[master] = {**step, "exp_avg": mine(states["exp_avg"]), "exp_avg_sq": mine(states["exp_avg_sq"])}


def _cut(tensor: torch.Tensor, size: int, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s ``size`` values of ``tensor`` flattened and zero-padded to ``size x world``."""
    flat = tensor.detach().float().flatten()
    return torch.nn.functional.pad(flat, (0, size * world - flat.numel())).narrow(0, size * rank, size).clone()
