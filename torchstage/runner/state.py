"""The runner <-> checkpoint mapping: what a run is made of, as one dict of tensors and plain values."""
import logging
import time

import torch

from torchstage.files.checkpoint_format import FORMAT, CheckpointError, clean_state_dict
from torchstage.launch.resolve import job_identity, restart_attempt
from torchstage.launch.script_seed import applied_seed
from torchstage.one_or_many import named
from torchstage.runner import global_batch
from torchstage.rng import get_rng_state, set_rng_state, set_seed
from torchstage.version import __version__

logger = logging.getLogger("torchstage")
HPARAMS = ("num_epochs", "valid_loader", "valid_metric", "minimize_valid_metric", "seed", "deterministic",
           "logdir", "scheduler_step", "checkpoint_period", "topk", "load_best_on_end")


def runner_state_dict(runner) -> dict:
    """Every part of the run needed to resume it exactly; collective under several processes."""
    spec, strategy = runner.spec, runner.strategy
    models = named(runner.unwrapped_model, "model")
    per_rank = _gather_per_rank(runner)
    return {
        "format": FORMAT,
        "models": {k: strategy.model_state_dict(m) for k, m in models.items()},
        "optimizers": {k: strategy.optimizer_state_dict(o, models)
                       for k, o in named(runner.optimizer, "optimizer").items()},
        "schedulers": {k: s.state_dict() for k, s in named(runner.scheduler, "scheduler").items()},
        "scaler": strategy.precision.state_dict(),
        "callbacks": _callback_states(runner, [rank["callbacks"] for rank in per_rank]),
        "loop": runner.loop_position(),
        "rng": [rank["rng"] for rank in per_rank],
        "metrics": {loader: dict(values) for loader, values in runner.loop.epoch_metrics.items()},
        "meta": {"torchstage": __version__, "torch": str(torch.__version__), "world_size": runner.engine.world_size,
                 "data_parallel": runner.engine.dp_size, "tensor_parallel": runner.engine.tp_size,
                 "strategy": repr(strategy), "mesh": _mesh_of(strategy), "nodes": runner.engine.nodes or [],
                 "job": job_identity(), "restart_attempt": restart_attempt(), "script_seed": applied_seed(),
                 "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "stage_names": [s.name for s in spec.stage_specs],
                 "stage_epochs": [s.num_epochs for s in spec.stage_specs],
                 "optimizers": {k: f"{type(o).__module__}.{type(o).__qualname__}"
                                for k, o in named(runner.optimizer, "optimizer").items()},
                 "hparams": {k: _plain(getattr(spec, k)) for k in HPARAMS},
                 "global_batch": global_batch.record(runner)},
    }


def load_runner_state_dict(runner, checkpoint: dict, weights_only: bool = False) -> None:
    """Put a checkpoint's weights (and unless ``weights_only`` everything else) into the runner."""
    strategy, models = runner.strategy, named(runner.unwrapped_model, "model")
    _load_named("model", models, checkpoint["models"],
                lambda m, s: strategy.load_model_state_dict(m, clean_state_dict(s)))
    if weights_only:
        return
    rng, world_size = checkpoint["rng"], runner.engine.world_size
    same_world = len(rng) == world_size
    same_layout = same_data_layout(checkpoint, runner.engine)
    _load_named("optimizer", named(runner.optimizer, "optimizer"), checkpoint["optimizers"],
                lambda o, s: strategy.load_optimizer_state_dict(o, models, s))
    _load_named("scheduler", named(runner.scheduler, "scheduler"), checkpoint["schedulers"],
                lambda o, s: o.load_state_dict(s))
    strategy.precision.load_state_dict(checkpoint.get("scaler", {}))
    for name, state in checkpoint.get("callbacks", {}).items():
        if name in runner.callbacks:
            callback = runner.callbacks[name]
            if callback.state_per_rank:
                state = _rank_state(callback, name, state, runner.engine, checkpoint, same_layout)
            if state:
                callback.load_state_dict(state)
    if same_world:
        set_rng_state(rng[runner.engine.rank])
    else:  # streams of another world: each rank's own, derived from the seed, the rank and the position
        set_seed(derived_seed(runner.spec.seed, runner.engine.dp_rank, checkpoint["loop"]["global_batch_step"]))


#: The seed of each rank's generators after a resume on another number of processes (see :func:`derived_seed`).
RESEED_STRIDE = 1_000_003


def derived_seed(seed: int, rank: int, global_batch_step: int) -> int:
    """``seed + rank + 1,000,003 x global_batch_step``: the seed of (data-parallel) rank ``rank``'s python, numpy and
    torch generators in a run resumed by another number of processes (the old streams belong to the old world)."""
    return seed + rank + RESEED_STRIDE * global_batch_step


def data_layout(checkpoint: dict) -> tuple:
    """``(data-parallel ranks, tensor-parallel ranks)`` of the run that wrote ``checkpoint`` (before meshes were
    recorded: every rank a data-parallel one)."""
    meta = checkpoint.get("meta", {})
    world = len(checkpoint["rng"])
    return int(meta.get("data_parallel", world)), int(meta.get("tensor_parallel", 1))


def same_data_layout(checkpoint: dict, engine) -> bool:
    """True when ``engine``'s ranks hold the same data as the ranks that wrote ``checkpoint`` did: the same world
    in the same data-parallel x tensor-parallel layout, so each rank continues its own part."""
    return len(checkpoint["rng"]) == engine.world_size and data_layout(checkpoint) == (engine.dp_size, engine.tp_size)


def _rank_state(callback, name: str, state: dict, engine, checkpoint: dict, same_layout: bool) -> dict:
    """This rank's part of a per-rank callback state; from another layout, the states of the ranks that counted
    samples (the first of each tensor-parallel group) merged on the main rank (what they held is counted once) and
    :meth:`~torchstage.callbacks.base.Callback.empty_rank_state` on the others."""
    if "per_rank" not in state:
        return {}
    states, written_by = state["per_rank"], len(checkpoint["rng"])
    if same_layout:
        return states[engine.rank]
    tensor = data_layout(checkpoint)[1]
    try:
        merged = callback.merge_rank_states([s for rank, s in enumerate(states) if s and rank % tensor == 0])
        return merged if engine.is_main else callback.empty_rank_state(merged)
    except TypeError as e:
        raise CheckpointError(f"checkpoint was written mid-loader by {written_by} process(es) and is resumed by "
                              f"{engine.world_size}: callbacks[{name!r}] keeps a partial state per rank ({e}); resume "
                              f"with {written_by} process(es), or from an end-of-epoch checkpoint") from None


def _load_named(kind: str, targets: dict, states: dict, load) -> None:
    missing = sorted(set(targets) - set(states))
    if missing:
        raise CheckpointError(f"checkpoint has no {kind} state for {missing}; it has {sorted(states)}")
    for name, target in targets.items():
        load(target, states[name])


def _gather_per_rank(runner) -> list:
    """Per rank, in rank order: its random state and the states of its ``state_per_rank`` callbacks (one
    all-gather under several processes, one sync point per checkpoint)."""
    mine = {"rng": {**get_rng_state(), **_loader_start(runner)},
            "callbacks": {name: callback.state_dict() for name, callback in runner.callbacks.items()
                          if callback.state_per_rank}}
    return runner.engine.all_gather_object(mine)


def _callback_states(runner, per_rank: list) -> dict:
    """Callback name -> state; a callback with ``state_per_rank = True`` keeps one state per rank (``per_rank``:
    each rank's states, gathered)."""
    states = {}
    for name, callback in runner.callbacks.items():
        if callback.state_per_rank:
            gathered = [rank[name] for rank in per_rank]
            state = {"per_rank": gathered} if any(gathered) else {}
        else:
            state = callback.state_dict()
        if state:
            states[name] = state
    return states


def _loader_start(runner) -> dict:
    """The random state the current loader pass started from, so a mid-epoch resume replays its order; an
    end-of-epoch checkpoint needs none (the next epoch's passes draw their own)."""
    state = runner.loop.loader_start_rng
    return {} if state is None or runner.loop.epoch_done else {"loader_start": state}


def _mesh_of(strategy) -> dict:
    """The strategy's mesh layout (replicate, shard, tensor), or {} for one without a mesh."""
    layout = strategy.mesh_layout()
    return layout.as_dict() if layout is not None else {}


def _plain(value):
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
