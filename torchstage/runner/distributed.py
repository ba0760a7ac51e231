"""``train(distributed=True)`` and ``train(...)`` inside a world: one rank's run, or the launch of all ranks."""
from torchstage.distributed.ddp import STRATEGIES
from torchstage.distributed.env import resolve_world
from torchstage.distributed.world import current_engine, in_world, joined, launch_and_exit
from torchstage.distributed.loaders import distribute_loaders
from torchstage.named import map_named
from torchstage.runner.dataset_loaders import build_loaders


def train_distributed(runner, spec):
    """Train as this rank of the current world, joining or launching it first; returns the runner.

    Outside a world with several local devices this process starts the workers and exits with their
    code (``SystemExit``), like :func:`~torchstage.distributed_cmd_run`.
    """
    check_strategy(spec.strategy)
    if in_world():
        return _train_rank(runner, spec)
    world = resolve_world(spec.nprocs)
    if world.spawn:
        launch_and_exit(world)
    if not world.is_distributed:
        from torchstage.runner.setup import prepare
        prepare(runner, spec)
        return runner.run()
    with joined(world):
        return _train_rank(runner, spec)


def check_strategy(strategy) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "fsdp":
        raise ValueError("strategy='fsdp' is not supported yet: sharding replaces the parameters that the "
                         "optimizer given to train() holds, so it would update stale tensors; use strategy='ddp'")


def _train_rank(runner, spec):
    """Prepare with this rank's engine and shards, wrap models after checkpoint loading, run, unwrap."""
    from torchstage.runner.setup import prepare
    engine = current_engine(spec.strategy)
    built = {}
    for stage in spec.stage_specs:
        source = stage.loaders if stage.loaders is not None else stage.datasets
        if id(source) not in built:  # stages sharing one dict share its loaders
            built[id(source)] = (distribute_loaders(stage.loaders, engine, spec.seed) if stage.loaders is not None
                                 else build_loaders(stage.datasets, engine, seed=spec.seed))
        stage.loaders, stage.datasets = built[id(source)], None
    prepare(runner, spec, engine)
    model = runner.model
    runner.model = map_named(engine.wrap_model, model)
    try:
        return runner.run()
    finally:
        runner.model = model
