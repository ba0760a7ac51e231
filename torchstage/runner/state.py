"""The runner <-> checkpoint mapping: what a run is made of, as one dict of tensors and plain values."""
import logging
import time

import torch

from torchstage.files.format import FORMAT, CheckpointError, clean_state_dict
from torchstage.launch.resolve import job_identity, restart_attempt
from torchstage.named import named
from torchstage.rng import get_rng_state, set_rng_state
from torchstage.version import __version__

logger = logging.getLogger("torchstage")
HPARAMS = ("num_epochs", "valid_loader", "valid_metric", "minimize_valid_metric", "seed", "deterministic",
           "logdir", "scheduler_step", "checkpoint_period", "topk", "load_best_on_end")


def runner_state_dict(runner) -> dict:
    """Every part of the run needed to resume it exactly; collective under several processes."""
    spec, strategy = runner.spec, runner.engine.strategy
    models = named(runner.unwrapped_model, "model")
    return {
        "format": FORMAT,
        "models": {k: strategy.model_state_dict(m) for k, m in models.items()},
        "optimizers": {k: strategy.optimizer_state_dict(o, models)
                       for k, o in named(runner.optimizer, "optimizer").items()},
        "schedulers": {k: s.state_dict() for k, s in named(runner.scheduler, "scheduler").items()},
        "scaler": strategy.precision.state_dict(),
        "callbacks": _callback_states(runner),
        "loop": runner.loop_position(),
        "rng": runner.engine.all_gather_object({**get_rng_state(), **_loader_start(runner)}),
        "metrics": {loader: dict(values) for loader, values in runner.epoch_metrics.items()},
        "meta": {"torchstage": __version__, "torch": str(torch.__version__), "world_size": runner.engine.world_size,
                 "job": job_identity(), "restart_attempt": restart_attempt(),
                 "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "stage_names": [s.name for s in spec.stage_specs],
                 "stage_epochs": [s.num_epochs for s in spec.stage_specs],
                 "optimizers": {k: f"{type(o).__module__}.{type(o).__qualname__}"
                                for k, o in named(runner.optimizer, "optimizer").items()},
                 "hparams": {k: _plain(getattr(spec, k)) for k in HPARAMS}},
    }


def load_runner_state_dict(runner, checkpoint: dict, weights_only: bool = False) -> None:
    """Put a checkpoint's weights (and unless ``weights_only`` everything else) into the runner."""
    strategy, models = runner.engine.strategy, named(runner.unwrapped_model, "model")
    _load_named("model", models, checkpoint["models"],
                lambda m, s: strategy.load_model_state_dict(m, clean_state_dict(s)))
    if weights_only:
        return
    rng, world_size = checkpoint["rng"], runner.engine.world_size
    same_world = len(rng) == world_size
    if not same_world and not checkpoint["loop"]["epoch_done"]:
        raise CheckpointError(f"checkpoint was written mid-epoch by {len(rng)} process(es); resume it with the same "
                              f"number, not {world_size}, or resume from an end-of-epoch checkpoint (each rank's "
                              f"data shard and random state belong to the world that wrote it)")
    _load_named("optimizer", named(runner.optimizer, "optimizer"), checkpoint["optimizers"],
                lambda o, s: strategy.load_optimizer_state_dict(o, models, s))
    _load_named("scheduler", named(runner.scheduler, "scheduler"), checkpoint["schedulers"],
                lambda o, s: o.load_state_dict(s))
    strategy.precision.load_state_dict(checkpoint.get("scaler", {}))
    for name, state in checkpoint.get("callbacks", {}).items():
        if name in runner.callbacks:
            if runner.callbacks[name].state_per_rank:
                state = state["per_rank"][runner.engine.rank] if "per_rank" in state and same_world else {}
            if state:
                runner.callbacks[name].load_state_dict(state)
    if same_world:
        set_rng_state(rng[runner.engine.rank])
    elif runner.engine.is_main:
        logger.warning("checkpoint written by %d process(es), resumed by %d: weights, optimizer, scheduler, callbacks "
                       "and loop position are restored; random streams and data shards start anew for this world "
                       "size, so the run continues but is not bitwise the one the old world would have run",
                       len(rng), world_size)


def _load_named(kind: str, targets: dict, states: dict, load) -> None:
    missing = sorted(set(targets) - set(states))
    if missing:
        raise CheckpointError(f"checkpoint has no {kind} state for {missing}; it has {sorted(states)}")
    for name, target in targets.items():
        load(target, states[name])


def _callback_states(runner) -> dict:
    """Callback name -> state; a callback with ``state_per_rank = True`` keeps one state per rank (collective)."""
    states = {}
    for name, callback in runner.callbacks.items():
        state = callback.state_dict()
        if callback.state_per_rank:
            gathered = runner.engine.all_gather_object(state)
            state = {"per_rank": gathered} if any(gathered) else {}
        if state:
            states[name] = state
    return states


def _loader_start(runner) -> dict:
    """The random state the current loader pass started from, so a mid-epoch resume replays its order; an
    end-of-epoch checkpoint needs none (the next epoch's passes draw their own)."""
    state = runner.loader_start_rng
    return {} if state is None or runner.epoch_done else {"loader_start": state}


def _plain(value):
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
