"""Putting a loaded checkpoint back into a prepared runner, and starting its loop where the old run stopped.

An epoch-boundary checkpoint resumes at the next epoch (or the next stage). A mid-epoch one (written
after a train batch) resumes in the same epoch and loader: loaders the old run had finished in that
epoch are not run again, and the interrupted loader skips its done batches by index (see
:mod:`torchstage.data.resume`), with the counters, partial metrics and RNG the old run had.
"""
import logging
import os

from torchstage.files.checkpoint_read import checkpoint_files, load_checkpoint, load_newest_intact
from torchstage.files.checkpoint_format import CheckpointError
from torchstage.data.loader_rng import capture_loader_rng
from torchstage.data.resume import (batch_size_changed, discard_persistent_iterator, filtered_pass,
                                    resume_after_samples, resume_iterator, skips_samples)
from torchstage.data.reshard import order_kind, pass_order, resume_shard
from torchstage.data.worker_start import started
from torchstage.runner.loop_state import dataset_size
from torchstage.runner.resume_checks import apply_after_load, check_before_load, report_epochs
from torchstage.runner.state import data_layout, same_data_layout
from torchstage.launch.resolve import LAUNCHER_COUNTERS, job_identity, restart_attempt, same_job
from torchstage.runner.elastic_join import joined_world
from torchstage.runner.errors import LogdirHoldsRun
from torchstage.runner.loop_state import ResumePoint
from torchstage.runner.shared import share
from torchstage.rng import set_rng_state

logger = logging.getLogger("torchstage")
_COUNTERS = ("global_epoch_step", "global_batch_step", "global_sample_step")


def checkpoint_to_resume(spec, engine, chains):
    """``(path, checkpoint)`` to resume from, or None; refuses to overwrite an earlier run's checkpoints.

    ``resume='last'`` looks where the run's checkpoint callbacks write (the latest stage's folder first)
    and takes ``last.pth``, or, if it is missing or damaged, the newest intact checkpoint there, saying so.
    ``resume='auto'`` does the same when that run is this job's (the job ids it recorded, see
    :func:`~torchstage.launch.resolve.same_job`), starts a run on an empty logdir, and refuses another job's run.
    """
    if spec.resume not in (None, "last", "auto"):
        return os.fspath(spec.resume), load_checkpoint(os.fspath(spec.resume))
    folders = list(dict.fromkeys(f for chain in reversed(chains) for f in share(chain.values()).checkpoint_folders(
        spec.logdir)))
    # The main rank looks before anyone can write, and every rank acts on what it saw: a slower rank
    # must not find the last.pth that this very run has just written.
    found = next((f for f in folders if checkpoint_files(f)), None) if engine.is_main else None
    found = engine.broadcast_object(found)
    if spec.resume is None and found is not None and job_identity().get("torchelastic_run"):
        joined = engine.broadcast_object(_joined(found, engine.nodes) if engine.is_main else None)
        if joined is not None:  # torchrun re-formed this job's world: its run goes on, whatever overwrite says
            if engine.is_main:
                logger.warning("the logdir's run is this job's own (%s): continuing its run from its last checkpoint%s",
                               joined, ", not replacing it (overwrite=True replaces another launch's run)"
                               if spec.overwrite else "")
            spec.resume = "last"
    if spec.resume is None:
        if found is not None and not spec.overwrite:
            raise LogdirHoldsRun(f"logdir {str(spec.logdir)!r} already holds a run ({checkpoint_files(found)[0]})", (
                ("pass resume='last' to continue it", "pass --set resume=last to continue it"),
                ("overwrite=True to replace it", "--set overwrite=true to replace it"),
                ("another logdir", "--set logdir=<another folder>")))
        return None
    if not folders:
        raise ValueError(f"resume={spec.resume!r} needs a logdir (or a CheckpointCallback with one) to find last.pth "
                         f"in")
    if found is None:
        _start_without_checkpoint(spec, engine, folders[0])
        return None
    checkpoint, choice = None, None
    if engine.is_main:
        try:
            path, checkpoint, skipped = load_newest_intact(found)
            choice = (path, skipped, None)
        except CheckpointError as e:
            choice = (None, [], str(e))
    path, skipped, error = engine.broadcast_object(choice)
    if error is not None:
        raise CheckpointError(error)
    if spec.resume == "auto" and engine.is_main:
        _check_same_job(spec, path, checkpoint)
    if skipped and engine.is_main:
        logger.warning("resume='last': %s; resuming from %s, the newest intact checkpoint",
                       "; ".join(f"{p} was passed over ({why})" for p, why in skipped), path)
    return path, checkpoint if checkpoint is not None else load_checkpoint(path)


def _joined(folder: str, nodes: list):
    """:func:`~torchstage.runner.elastic_join.joined_world` of the newest intact checkpoint in ``folder`` (None when
    none loads)."""
    try:
        return joined_world(load_newest_intact(folder)[1], nodes)
    except CheckpointError:
        return None


def resume_of_this_attempt(resume, agreed: int = 0):
    """``'last'`` for a job that its launcher restarted (``torchrun --max-restarts``, ``train(max_restarts=...)``)
    and that names no checkpoint: the unchanged script continues its own run; else ``resume`` (a SLURM requeue is
    :func:`~torchstage.launch.slurm.requeue.check_requeue_arg`'s, applied before). ``agreed``: the restart count the
    world's ranks agreed on (a node that joined an elastic job later counts 0 restarts of its own)."""
    attempt = restart_attempt({name: os.environ.get(name, "") for name in LAUNCHER_COUNTERS})
    if resume is None and max(attempt, agreed) > 0:
        return "last"
    return resume


def _check_same_job(spec, path: str, checkpoint: dict) -> None:
    """``resume='auto'`` continues the logdir's run only when it is this job's; another job's run is refused."""
    recorded = checkpoint.get("meta", {}).get("job", {})
    if same_job(recorded) is False:
        ids = ", ".join(f"{key} {value}" for key, value in recorded.items())
        now = ", ".join(f"{key} {value}" for key, value in job_identity().items())
        raise LogdirHoldsRun(f"resume='auto': logdir {str(spec.logdir)!r} holds the run of another job ({path}: "
                             f"{ids}; this is {now})", (
                                 ("pass resume='last' to continue it anyway", "pass --set resume=last to continue "
                                                                              "it anyway"),
                                 ("overwrite=True to replace it", "--set overwrite=true to replace it"),
                                 ("another logdir", "--set logdir=<another folder>")))


def _start_without_checkpoint(spec, engine, folder: str) -> None:
    """``resume='last'`` without a checkpoint starts a new run, unless an earlier run's logs show that its
    checkpoints are gone (deleted, or written elsewhere): then nothing would be continued, and that is refused.
    A job its scheduler restarted (a SLURM requeue, ``torchrun --max-restarts``) starts over with a warning."""
    earlier = engine.broadcast_object(_earlier_logs(spec.logdir) if engine.is_main else None)
    if not earlier:
        logger.info("resume=%r: no checkpoint in %s yet, starting a new run", spec.resume, folder)
        return
    if restart_attempt() > 0 or spec.resume == "auto":
        logger.warning("resume=%r: %s left logs (%s) but no checkpoint in %s; starting the run over", spec.resume,
                       "the attempt before this restart" if restart_attempt() > 0 else "an earlier run", earlier,
                       folder)
        return
    raise LogdirHoldsRun(
        f"resume='last': logdir {str(spec.logdir)!r} holds the logs of an earlier run ({earlier}) but no checkpoint "
        f"in {folder}, so there is nothing to continue: its checkpoints were deleted or written elsewhere", (
            ("restore them, pass resume=<path of a checkpoint file>", "restore them, pass --set resume=<checkpoint "
                                                                      "file>"),
            ("resume=None with overwrite=True to start over in this logdir", "--set resume=null --set overwrite=true "
                                                                             "to start over in this logdir")))


def _earlier_logs(logdir) -> str:
    """The log files an earlier run left in ``logdir`` (``logs/*.csv``), as text; empty when there are none."""
    folder = os.path.join(os.fspath(logdir), "logs")
    names = sorted(name for name in os.listdir(folder) if name.endswith(".csv")) if os.path.isdir(folder) else []
    return ", ".join(os.path.join("logs", name) for name in names)


def restore(runner, checkpoint: dict, path: str = "the checkpoint") -> None:
    """Continue where ``checkpoint`` stopped; the next event is the first one the old run did not reach."""
    loop = checkpoint["loop"]
    names = [stage.name for stage in runner.spec.stage_specs]
    if loop["stage"] not in names:
        raise CheckpointError(f"checkpoint was written in stage {loop['stage']!r}, which this run does not have "
                              f"(stages: {names})")
    index = names.index(loop["stage"])
    runner.enter_stage(index)
    given = check_before_load(runner, checkpoint, path)
    runner.load_state_dict(checkpoint)
    apply_after_load(runner, given)
    report_epochs(runner, checkpoint, path)
    for key in _COUNTERS:
        setattr(runner, key, loop[key])
    runner.loop.epoch_metrics = runner.epoch_metrics_type(checkpoint.get("metrics", {}))
    if loop["epoch_done"]:
        runner.loop.epoch = loop["epoch"]
        if runner.loop.epoch >= runner.loop.num_epochs and index + 1 < len(names):
            runner.enter_stage(index + 1)
        return
    loader, rngs = loop.get("loader"), checkpoint["rng"]
    same_world = same_data_layout(checkpoint, runner.engine)
    rng = rngs[runner.engine.rank] if same_world else rngs[0]
    if loader not in runner.loop.loaders or "loader_start" not in rng:
        raise CheckpointError(f"checkpoint was written in the middle of loader {loader!r} of stage "
                              f"{loop['stage']!r}, which this run does not have (loaders: {list(runner.loop.loaders)})"
                              if "loader_start" in rng else
                              "checkpoint was written mid-epoch without the loader's random state; it cannot "
                              "be resumed exactly")
    runner.loop.epoch = loop["epoch"] - 1  # the loop runs this epoch again...
    runner.loop.global_epoch_step -= 1  # ...and its start counts it again
    point = dict(loader=loader, batch=loop["loader_batch"], train_batches_done=loop["batch"],
                 loader_sample_step=loop["loader_sample_step"], metrics=runner.loop.epoch_metrics)
    if same_world and "reshard" not in rng["loader_start"]:
        by_samples = _check_mid_epoch_loader(runner, loader, loop, path)
        runner.loop.resume_point = ResumePoint(**point, loader_rng=rng["loader_start"], rng=rng, by_samples=by_samples)
        return
    _check_mid_epoch_loader(runner, loader, loop, path, batch_size=False)
    lineage, indices = _reshard(runner, loader, loop, rng["loader_start"], data_layout(checkpoint)[0], path)
    runner.loop.resume_point = ResumePoint(**point, loader_rng=lineage, rng=rng if same_world else None,
                                           indices=indices)


def _reshard(runner, name: str, loop: dict, start: dict, ck_world: int, path: str) -> tuple:
    """``(lineage, indices)`` of a pass interrupted under ``ck_world`` data-parallel ranks and resumed under this
    world's (or resumed before): the samples of its order not done yet, dealt out anew; this rank's share of them
    (the ranks of a tensor-parallel group get the same share)."""
    loader, world, rank = runner.loop.loaders[name], runner.engine.dp_size, runner.engine.dp_rank
    kind = order_kind(loader)
    if kind is None:
        raise CheckpointError(f"cannot resume from {path} with {world} process(es): it was written by {ck_world} in "
                              f"the middle of loader {name!r}, a {type(loader).__name__} whose pass cannot be dealt "
                              f"out anew (torchstage does it for DataLoaders over map-style datasets with a random or "
                              f"sequential sampler); resume with {ck_world} process(es), or from an end-of-epoch "
                              f"checkpoint")
    if "reshard" in start:  # this pass was already resumed on another world
        lineage = start["reshard"]
    else:
        shuffle, seed = kind
        lineage = {"base": {"size": len(loader.dataset), "world": ck_world, "shuffle": shuffle,
                            "seed": runner.spec.seed if seed is None else seed, "epoch": loop["global_epoch_step"],
                            "loader_rng": start}, "steps": []}
    done = loop["loader_sample_step"] * ck_world
    steps = [*lineage["steps"], [done, world]]
    order = pass_order(lineage["base"], steps)
    if runner.engine.is_main and world != ck_world:
        logger.warning("resume from %s: loader %r was interrupted after %d samples of its epoch's order by %d "
                       "process(es); the %d left are dealt out to %d (each sample of the epoch once, apart from the "
                       "padding that gives every rank as many batches)", path, name, done, ck_world, len(order), world)
    return {"reshard": {"base": lineage["base"], "steps": steps}}, order[rank::world]


def _check_mid_epoch_loader(runner, name: str, loop: dict, path: str, batch_size: bool = True) -> bool:
    """A loader interrupted mid-pass must still hold the samples its order was drawn over (refused otherwise);
    True when its batch size changed, so the pass goes on after the samples done (logged)."""
    loader, where = runner.loop.loaders[name], f"loader {name!r} of stage {loop['stage']!r}"
    before, now = loop.get("loader_samples"), dataset_size(runner.loop.loaders[name])
    if before is not None and now is not None and before != now:
        raise CheckpointError(f"cannot resume from {path}: it was written in the middle of {where}, whose dataset had "
                              f"{before} samples; it has {now} now, so the epoch's order (drawn over {before}) cannot "
                              f"go on: every sample once is no longer possible. Resume with the same dataset, or from "
                              f"an end-of-epoch checkpoint")
    if not batch_size:
        return False
    changed = batch_size_changed(loader, loop["loader_batch"], loop["loader_sample_step"])
    if changed is None:
        return False
    old, new = changed
    old = int(old) if float(old).is_integer() else old
    if not skips_samples(loader):
        raise CheckpointError(f"cannot resume from {path}: it was written after {loop['loader_sample_step']} samples "
                              f"of {where} in batches of {old}, and batches hold {new} now; this loader's batch "
                              f"sampler cannot start after a number of samples. Resume with batch size {old}, or "
                              f"from an end-of-epoch checkpoint")
    if runner.engine.is_main:
        logger.warning("resume from %s: %s was interrupted after %d samples in batches of %s; its batches hold %d "
                       "now, so the pass goes on from sample %d (each sample of the epoch once)", path, where,
                       loop["loader_sample_step"], old, new, loop["loader_sample_step"] + 1)
    return True


def remaining_loaders(runner) -> list:
    """The current epoch's ``(name, loader)`` pairs, less those a resumed epoch had already finished."""
    items = list(runner.loop.loaders.items())
    point = runner.loop.resume_point
    if point is not None:
        items = items[[name for name, _ in items].index(point.loader):]
    return items


def loader_batches(runner, skips=None):
    """``(batch_step, batch)`` pairs of the current loader; a resumed loader starts after its done batches.

    Also records in ``runner.loader_start_rng`` the random state the pass starts from, which every
    checkpoint keeps so that a mid-epoch resume replays the same order. ``skips`` (a rollback run's train pass): a
    function giving the :class:`~torchstage.data.skips.PassFilter` of the pass starting, asked as each pass of the
    loader's sampler starts (a persistent iterator keeps the sampler): the batches of its skip list are left out
    and the rest recorded.
    """
    point = runner.loop.resume_point
    if point is None or point.loader != runner.loop.loader_key:
        if skips is None:
            runner.loop.loader_start_rng = capture_loader_rng(runner.loop.loader)
            return enumerate(started(runner.loop.loader), 1)  # a worker stuck in its fork is started again
        discard_persistent_iterator(runner.loop.loader, unless_filtered=True)  # before the capture: it may draw anew
        runner.loop.loader_start_rng = capture_loader_rng(runner.loop.loader)
        return enumerate(filtered_pass(runner.loop.loader, skips), 1)
    runner.loop.resume_point = None
    runner.loop.loader_start_rng = point.loader_rng
    runner.loop.train_batches_done = point.train_batches_done
    runner.loop.loader_sample_step = point.loader_sample_step
    done = {name: metrics for name, metrics in point.metrics.items() if name != runner.loop.loader_key}
    runner.loop.epoch_metrics = runner.epoch_metrics_type({**done, runner.loop.loader_key: runner.loop.loader_metrics})
    done = point.batch
    if point.loader_restored:  # a stateful loader was put back where it was (LoaderStateCallback)
        batches = iter(runner.loop.loader)
        set_rng_state(point.rng)
    elif point.indices is not None:  # resumed on another world (or resumed so before): its share of the rest
        runner.loop.loader_sample_step = 0  # samples of this rank's share, from which a later resume goes on
        batches, done = resume_shard(runner.loop.loader, point.indices, skips)
        if point.rng is not None:
            set_rng_state(point.rng)
    elif point.by_samples:  # its batch size changed: on from the first sample not done
        batches, done = resume_after_samples(runner.loop.loader, point.loader_sample_step, point.loader_rng, point.rng,
                                             skips)
    else:
        batches = resume_iterator(runner.loop.loader, point.batch, point.loader_rng, point.rng, skips)
    return enumerate(batches, done + 1)
