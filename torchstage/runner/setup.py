"""Turning a checked spec into a ready runner: engine, seed, logdir, models, loaders, chains, resume, and the
strategy's joint setup (what trains).

The order of :func:`prepare` is the order of what each step needs: the strategy's layout of the world (refused
before any collective), the world's nodes, the engine (made once, from the world, the layout and the nodes), the
strategy connected to it, the run's agreement channel; everything after reads the finished engine.
"""
import difflib
import logging
import os
from dataclasses import fields, replace

import torch

from torchstage.data.datasets import FACTORY, build_loaders
from torchstage.distributed.agreement import AgreementChannel
from torchstage.distributed.collectives import all_gather_object
from torchstage.data.loaders import distribute_loaders
from torchstage.data.fork_check import warn_forked_workers
from torchstage.data.rank_agreement import check_same_data, checked_dataset
from torchstage.files.lock import LogdirLock
from torchstage.launch.enter import process_group_timeout, run_in_world
from torchstage.launch.flight_recorder import mark_finished, point_dumps_to
from torchstage.launch import startup_watch
from torchstage.launch.membership import agree_membership
from torchstage.launch.preflight.check import check_before_training
from torchstage.launch.resolve import LAUNCHED_ENV, restart_attempt, set_agreed_attempt
from torchstage.launch.world import World
from torchstage.logging_setup import ensure_console_handler
from torchstage.one_or_many import each, map_named, named
from torchstage.rng import set_seed
from torchstage.runner.chain import describe_chain
from torchstage.runner.compile import compile_models
from torchstage.runner.failure_record import record_on_abort
from torchstage.runner.large_models import checkpoint_activations, set_initial_weights
from torchstage.runner.loop_state import LoopState
from torchstage.runner.resume import checkpoint_to_resume, restore, resume_of_this_attempt
from torchstage.runner.shared import share
from torchstage.runner.spec_optimization import check_scheduler_steps
from torchstage.runner.spec_stages import check_built_loaders
from torchstage.distributed.engine import Engine
from torchstage.runner.engine import RunEngine

logger = logging.getLogger("torchstage")
#: What a rank of train() imports before its first step beyond torch's usual (the main rank's TensorBoard logger):
#: the preloaded process that starts the ranks imports it once (see torchstage.launch.rank_start).
RANK_IMPORTS = ("tensorboardX.summary", "tensorboardX.proto.plugin_hparams_pb2", "tensorboardX.proto.api_pb2")


def train_in_world(runner, spec):
    """Train as this process's rank of its world (joined or launched first, see ``run_in_world``); the runner."""
    if spec.distributed is not False:
        point_dumps_to(spec.logdir)  # NCCL's Flight Recorder dump on a timeout: into the logdir
    return run_in_world(lambda world: _train_here(runner, spec, world), spec.distributed, spec.nprocs,
                        timeout=process_group_timeout(spec.hang_timeout), max_restarts=spec.max_restarts,
                        hang_timeout=spec.hang_timeout, check=spec.strategy.layout, preload=RANK_IMPORTS)


def _train_here(runner, spec, world: World):
    """Check the ranks first (``preflight=True``), prepare with this rank's engine, run with the models the strategy
    set up, leave the plain models behind."""
    if spec.preflight and world.is_distributed:
        startup_watch.phase("running the pre-flight check")
        check_before_training(world)  # PreflightFailed (exit code 1) on every rank when one is slow
    resumed = prepare(runner, spec, world)
    model = runner.model
    startup_watch.phase("setting up the strategy (wrapping the models)")
    runner.model = setup_strategy(runner, resumed)
    complete, restore = False, record_on_abort(runner)
    try:
        startup_watch.stop()  # the hang watchdog takes over from the first event
        result = runner.run()
        complete = True
        if runner.engine.is_distributed and runner.engine.is_main:
            mark_finished(spec.logdir)  # an earlier attempt's collective records describe a failure recovered from
        return result
    finally:
        restore()
        set_agreed_attempt(0)  # the restart count agreed by this run's world is this run's
        runner.model = model
        runner.channel.close(complete)
        runner.strategy.teardown(complete)  # before the world's process group is destroyed


def prepare(runner, spec, world: World = None):
    """Everything before the first event on this rank of ``world`` (None: one process) but the strategy's setup: no
    training happens here, every user error is raised here. Returns the optimizer states of the checkpoint the run
    resumes from (None: a fresh run), for an optimizer the strategy's setup supplies."""
    ensure_console_handler()
    runner.spec = spec
    world = world or World()
    if spec.engine is not None and (spec.distributed or world.is_distributed):  # the one check of this rule
        why = "distributed=True" if spec.distributed else f"the {world.world_size} processes a launcher started"
        raise ValueError(f"engine=... sets the device of a one-process run; with {why} each process takes its "
                         f"device from its rank: drop engine=... (got {spec.engine!r})")
    startup_watch.phase("setting up the strategy")
    runner.strategy = strategy = spec.strategy
    layout = strategy.layout(world)  # a layout that cannot work is refused here, before any collective
    nodes, restarts = agree_membership(lambda value: all_gather_object(value, world.world_size))
    engine = run_engine(spec.engine or runner.engine, world, layout, nodes, spec)
    strategy.connect(engine, spec.amp)
    runner.engine, runner.channel = RunEngine.of(engine, strategy), AgreementChannel(engine)
    _announce(world, engine, strategy)
    spec.resume = resume_of_this_attempt(spec.resume, restarts)  # a node that joined later counts 0 restarts itself
    # by data-parallel rank: the ranks of a tensor-parallel group draw alike (dropout on their replicated activations)
    set_seed(spec.seed + runner.engine.dp_rank, spec.deterministic)
    runner.model = spec.model
    for stage in spec.stage_specs:
        if isinstance(stage.criterion, torch.nn.Module):
            stage.criterion.to(runner.engine.device)
    startup_watch.phase("placing the models")
    _place_models(runner)
    checkpoint_activations(runner, spec)
    startup_watch.phase("compiling the models")
    compile_models(runner, spec.compile)
    startup_watch.phase("building the datasets")
    runner.stage_loaders = stage_loaders(spec, runner.engine)
    startup_watch.phase("checking the run")
    for stage, loaders in zip(spec.stage_specs, runner.stage_loaders):
        check_built_loaders(stage, loaders)
        check_scheduler_steps(stage, loaders)
    if runner.engine.is_distributed:
        datasets, origins = _datasets_to_compare(spec, runner.stage_loaders)
        check_same_data(datasets, runner.engine, origins)
    runner.stage_callbacks = spec.stage_chains
    for stage, chain, loaders in zip(spec.stage_specs, runner.stage_callbacks, runner.stage_loaders):
        _check_valid_metric(runner, stage, chain, loaders)
        _check_claims(stage, chain)
    runner.loop = LoopState()
    runner.enter_stage(0)
    if spec.logdir is not None:  # another run writing there is named first; run() takes the lock
        LogdirLock.on_main_rank(spec.logdir, runner.engine, take=False)
    startup_watch.phase("loading the checkpoint")
    found = checkpoint_to_resume(spec, runner.engine, runner.stage_callbacks)
    if found is not None:
        _log_resume(*found, runner.engine)
        restore(runner, found[1], path=found[0])
    set_initial_weights(runner, spec, resumed=found is not None)
    if runner.engine.is_main and spec.verbose:
        logger.info("callbacks of stage %r:\n%s", runner.loop.stage_key, describe_chain(runner.callbacks))
    return found[1]["optimizers"] if found is not None else None


def run_engine(given, world: World, layout, nodes, spec) -> Engine:
    """This rank's engine for the run, the one place it is made: from the world under several processes, else from
    the runner's own engine (``device=``) or the default one; in the strategy's ``layout``, with the world's
    ``nodes`` and the placement settings."""
    settings = dict(layout=layout, nodes=nodes, channels_last=bool(spec.channels_last), prefetch=bool(spec.prefetch))
    if world.is_distributed or given is None:
        return Engine.for_world(world, **settings)
    if isinstance(given, RunEngine):  # an earlier run's: its values, not its strategy
        given = Engine(**{f.name: getattr(given, f.name) for f in fields(Engine)})
    return replace(given, **settings)


def _announce(world: World, engine: Engine, strategy) -> None:
    """One line on the main rank of a world of several processes: how many, on how many nodes, from which
    launcher, and the strategy with its device mesh."""
    if not engine.is_distributed or not engine.is_main:
        return
    nodes = world.nnodes or (max(1, engine.world_size // engine.node_size) if engine.node_size else "?")
    mesh = strategy.describe()
    split = [f"{name}-parallel {n}" for name, n in engine.layout.model_dims().items() if n > 1]
    data = f", data-parallel {engine.dp_size} x {' x '.join(split)}" if split else ""
    source = "torchstage's launcher" if os.environ.get(LAUNCHED_ENV) else world.source  # (its workers look torchrun's)
    logger.info("world: %d processes on %s node%s (%s, %s backend), strategy %s%s%s", engine.world_size, nodes,
                "" if nodes == 1 else "s", source, world.backend, type(strategy).__name__, f", {mesh}" if mesh else "",
                data)


def stage_loaders(spec, engine) -> list:
    """Each stage's loaders for this engine: user loaders sharded across ranks, ``datasets`` built here.

    Stages sharing one ``loaders`` or ``datasets`` dict share its loaders (a ``get_datasets_fn`` runs once).
    """
    built = {}
    for stage in spec.stage_specs:
        source = stage.loaders if stage.loaders is not None else stage.datasets
        if id(source) not in built:
            built[id(source)] = (distribute_loaders(stage.loaders, engine, spec.seed) if stage.loaders is not None
                                 else build_loaders(stage.datasets, engine, seed=spec.seed))
    for loaders in built.values():
        warn_forked_workers(loaders, engine)
    return [built[id(stage.loaders if stage.loaders is not None else stage.datasets)] for stage in spec.stage_specs]


def _datasets_to_compare(spec, loaders_of_stages) -> tuple:
    """Label -> each map-style dataset the ranks must share, once: before sharding, the user's loaders (not those
    the user sharded) and the ``datasets=`` torchstage built; and label -> where it came from (``loaders``,
    ``datasets`` or ``get_datasets_fn``, for the advice)."""
    found = []  # (dataset, labels of the loaders reading it, origin)
    for stage, built in zip(spec.stage_specs, loaders_of_stages):
        prefix = "" if stage.name == "main" else f"stages[{stage.name!r}] "
        origin = ("loaders" if stage.loaders is not None else
                  "get_datasets_fn" if FACTORY in stage.datasets else "datasets")
        for name, loader in (stage.loaders if stage.loaders is not None else built).items():
            dataset = checked_dataset(loader, built=stage.loaders is None)
            if dataset is not None:
                labels = next((labels for d, labels, _ in found if d is dataset), None)
                if labels is None:
                    labels = []
                    found.append((dataset, labels, origin))
                labels.append(f"{prefix}loader {name!r}")
    label = {id(dataset): labels[0] + (f" (also read by {', '.join(labels[1:])})" if labels[1:] else "")
             for dataset, labels, _ in found}
    return ({label[id(dataset)]: dataset for dataset, _, _ in found},
            {label[id(dataset)]: origin for dataset, _, origin in found})


def _place_models(runner) -> None:
    runner.model = map_named(runner.strategy.place, runner.model)


def setup_strategy(runner, resumed: dict = None):
    """The strategy's joint setup: the placed models, the run's optimizers and the step plans the callbacks of the
    chains declare go in; the models as they train come back. An optimizer the strategy's own configuration names
    goes to the stages given none, with its state from ``resumed`` (a checkpoint's optimizer states)."""
    stages, strategy = runner.spec.stage_specs, runner.strategy
    given = list({id(o): o for stage in stages for o in each(stage.optimizer)}.values())
    plans = [plan for stage, chain in zip(stages, runner.stage_callbacks) for callback in chain.values()
             for plan in callback.step_plans(stage)]
    sizes = [getattr(loader, "batch_size", None) for loaders in runner.stage_loaders
             for key, loader in loaders.items() if key.startswith("train")]
    models, optimizers = strategy.setup(named(runner.model, "model"), given, plans, sizes[0] if sizes else None)
    supplied = [o for o in optimizers if not any(o is g for g in given)]
    if supplied:
        for stage in stages:
            if stage.optimizer is None:
                stage.optimizer = supplied[0]
        runner.optimizer = stages[runner.loop.stage_index].optimizer
        if resumed is not None and "optimizer" in resumed:
            strategy.load_optimizer_state_dict(supplied[0], named(runner.unwrapped_model, "model"),
                                               resumed["optimizer"])
    return models if isinstance(runner.model, dict) else models["model"]


def _check_valid_metric(runner, stage, chain, loaders) -> None:
    """``valid_metric``, and each loader and metric a callback reads (:meth:`Callback.needs`), must exist."""
    prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
    for key, callback in chain.items():
        for loader, _ in callback.needs(stage):
            if loader not in loaders:
                raise ValueError(f"{prefix}callbacks[{key!r}] ({type(callback).__name__}) reads loader {loader!r}, "
                                 f"which this stage does not have (loaders: {list(loaders)})")
    if runner.produces is None:
        return  # a custom handle_batch: checked when the first loader ends
    produced = set(runner.produces).union(*(cb.produces for cb in chain.values()))
    if stage.valid_metric not in produced:
        raise ValueError(f"{prefix}valid_metric={stage.valid_metric!r} is produced by no callback; the chain "
                         f"produces {sorted(produced)}. Add a metric callback that writes it, or pick one of those")
    for key, callback in chain.items():
        for _, metric in callback.needs(stage):
            if metric not in produced:
                close = difflib.get_close_matches(metric, sorted(produced), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"{prefix}callbacks[{key!r}] ({type(callback).__name__}) reads metric {metric!r}, "
                                 f"which no callback produces; the chain produces {sorted(produced)}{hint}")


def _check_claims(stage, chain) -> None:
    """What only one callback of a chain may do (:meth:`~torchstage.runner.shared.Shared.claim`) is claimed once."""
    prefix = "" if stage.name == "main" else f"stages[{stage.name!r}]: "
    for what, (fix, claimants) in share(chain.values()).claims.items():
        if len(claimants) > 1:
            names = [name for name, callback in chain.items() if any(callback is c for c in claimants)]
            raise ValueError(f"{prefix}callbacks {names} would all {what}; {fix}")


def _log_resume(path: str, checkpoint: dict, engine) -> None:
    """Say, on the main rank, which checkpoint the run goes on from and where in the loop."""
    loop, attempt = checkpoint.get("loop", {}), restart_attempt()
    if engine.is_main:
        logger.info("resuming from %s at stage %r, epoch %s, batch %s%s%s", path, loop.get("stage"), loop.get("epoch"),
                    loop.get("batch"), " (epoch complete)" if loop.get("epoch_done") else "",
                    f"; restart attempt {attempt} of this job" if attempt else "")
