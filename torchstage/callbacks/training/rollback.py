"""Rollbacks: go back to the last clean check and on without the bad batch, exactly as if the loader never gave it.

:class:`RollbackCallback` (``rollback`` in the chain, added when a :class:`NonFiniteLossCallback` has
``mode="rollback"``) runs after every other callback. It takes an in-memory snapshot of the run (see
:mod:`torchstage.runner.snapshot`) as each train loader starts and after a clean check of the losses (every
``check_every`` batches, before each checkpoint), at most once a second (:data:`SNAPSHOT_PERIOD`, agreed by the
ranks in the check's all-reduce). When a check finds a bad loss, every rank puts its last snapshot
back, the loader starts again from its point as a run resumed there would, and the first bad batch is left out
of the pass by its ordinal (never read again): a run that rolls back past batch k ends as a run whose loader
yields the same batches without batch k. The skip list is kept in checkpoints, so a resumed or restarted run
skips those batches too; it counts the rollbacks of the run, at most ``max_rollbacks``, and stops (as
``mode="stop"`` does) at the next one or at the same batch twice.
"""
import logging
import time

import torch

from torchstage.callbacks.base import Callback, RollBack
from torchstage.data.skips import PassFilter, sample_indices
from torchstage.one_or_many import named
from torchstage.rng import set_rng_state

logger = logging.getLogger("torchstage")
#: After every phase (loggers and user callbacks included): a snapshot holds what every callback did with a batch.
ROLLBACK_ORDER = 10_000
#: Sample indices shown per rank in a rollback's log line (all are kept in the skip list).
SHOWN = 32
#: Seconds between two snapshots at least (besides the one as each train loader starts): where a check comes every
#: few milliseconds, a snapshot at each would cost a share of the run; a rollback then goes back a little further.
SNAPSHOT_PERIOD = 1.0


class RollbackCallback(Callback):
    """Takes the snapshots a rollback goes back to, puts them back, and keeps the skip list (see the module)."""

    order = ROLLBACK_ORDER
    name = "rollback"
    train_batches_only = True

    def __init__(self):
        self.skipped = []  #: the batches left out: where, why, and the samples each rank held there
        self.rollbacks = 0  #: rollbacks of the run
        self._snapshot, self._clean_at, self._mid_pass, self._start_rng = None, None, False, None
        self._taken = 0.0  # time.monotonic() of the last snapshot

    # ---- before training -------------------------------------------------------------------------
    def on_experiment_start(self, runner):
        why = runner.engine.strategy.no_snapshots
        if why:
            raise ValueError(f"NonFiniteLossCallback(mode='rollback') keeps an in-memory snapshot of the models and "
                             f"optimizers, and strategy={runner.engine.strategy!r} cannot give one: {why}. Use "
                             f"mode='stop' (the run stops at a bad loss and resumes from its last checkpoint), or "
                             f"strategy='ddp' or 'fsdp'")
        for stage, loaders in zip(runner.spec.stage_specs, runner.stage_loaders):
            for name, loader in loaders.items():
                if name.startswith("train") and callable(getattr(loader, "load_state_dict", None)):
                    raise ValueError(f"NonFiniteLossCallback(mode='rollback') replays a train loader's pass by index "
                                     f"from where it started; loader {name!r} of stage {stage.name!r} is a stateful "
                                     f"{type(loader).__name__}, which resumes from its own state: use mode='stop', or "
                                     f"a plain DataLoader")

    # ---- the snapshots ---------------------------------------------------------------------------
    def on_loader_start(self, runner):
        loop = runner.loop
        if not loop.is_train_loader:
            loop.pass_filter = None
            return
        world, rank = runner.engine.world_size, runner.engine.rank
        pass_key = _pass_key(runner)
        drop = {entry["ordinal"]: _mine(entry, rank) for entry in self.skipped
                if _pass_key_of(entry) == pass_key and entry["world"] == world}
        loop.pass_filter = PassFilter(drop)
        if self._start_rng is not None:  # back at a loader's start: its draws begin where the snapshot's did
            set_rng_state(self._start_rng)
            self._start_rng = None
        point = loop.resume_point
        # mid-pass snapshots resume by index; a pass dealt out anew on resume goes back to its start only
        self._mid_pass = point is None or not (point.indices is not None or point.by_samples or point.loader_restored)
        self._snapshot = runner.take_snapshot(at_start=True, leave_out=(self.name,), reuse=self._snapshot)
        self._clean_at, self._taken = None, time.monotonic()

    def snapshot_due(self) -> bool:
        """Whether this rank would take a snapshot after a clean check now: inside a pass that resumes by index, at
        least :data:`SNAPSHOT_PERIOD` seconds after the last one (the ranks agree on it with the check)."""
        return self._mid_pass and time.monotonic() - self._taken >= SNAPSHOT_PERIOD

    def clean(self, runner) -> None:
        """A check found every loss good up to this batch and the ranks agreed on a snapshot: the run is snapshot
        after it (by this callback's ``on_batch_end``, after every other callback's)."""
        if runner.loop.pass_filter is not None:
            self._clean_at = runner.loop.batch_step

    def on_batch_end(self, runner):
        loop = runner.loop
        if not self._mid_pass or self._clean_at != loop.batch_step or self._snapshot.batch == loop.batch_step:
            return
        if _gradients_pending(runner):  # inside an accumulation group: the snapshot could not hold the gradients
            return
        self._snapshot = runner.take_snapshot(at_start=False, leave_out=(self.name,), reuse=self._snapshot)
        self._taken = time.monotonic()
        loop.pass_filter.forget(loop.batch_step)

    def on_loader_end(self, runner):
        runner.loop.pass_filter = None

    # ---- a rollback ------------------------------------------------------------------------------
    def roll_back(self, runner, finding: dict, what: str, limit: int) -> None:
        """Put the run back to the last snapshot and start the loader again without the first bad batch (raises
        :class:`~torchstage.callbacks.base.RollBack`); raise ``finding["error"]`` instead when that would be
        rollback ``limit + 1`` or the same batch twice. Collective: every rank calls it at the same check."""
        loop, engine = runner.loop, runner.engine
        drawn = loop.pass_filter.drawn if loop.pass_filter is not None else {}  # None: no train pass under way
        ordinal, item = drawn.get(finding["position"], (None, None))
        samples = engine.all_gather_object(sample_indices(item))
        entry = {"stage": runner.stage_key, "epoch": runner.global_epoch_step, "loader": runner.loader_key,
                 "ordinal": ordinal, "world": engine.world_size, "global_batch": finding["step"],
                 "reason": what, "samples": [None if s is None else torch.tensor(s, dtype=torch.int64)
                                             for s in samples]}
        again = self._seen(entry)
        if again or self.rollbacks >= limit or ordinal is None:
            why = (f"batch {ordinal} of this pass was rolled back past before ({again})" if again else
                   "no train loader's pass is under way" if loop.pass_filter is None else
                   "its ordinal in the pass is unknown" if ordinal is None else
                   f"it would be rollback {self.rollbacks + 1}, over max_rollbacks={limit}")
            raise finding["error"](f"{what}; not rolled back: {why}, so the run stops here (the last checkpoint "
                                   f"holds no weights trained on it)", origin_rank=finding["rank"])
        snapshot = self._snapshot
        self.skipped.append(entry)
        self.rollbacks += 1
        if engine.is_main:
            back = ("the loader's start" if snapshot.at_start and snapshot.resume_point is None else
                    "where the loader resumed" if snapshot.at_start else "the snapshot after a clean check")
            logger.warning("rollback %d of at most %d: %s; back to global batch %d (%s, batch %d of loader %r); the "
                           "pass goes on without that batch (ordinal %d of the pass; samples %s)", self.rollbacks,
                           limit, what, snapshot.global_batch, back, snapshot.batch, snapshot.loader, ordinal,
                           _shown(samples))
        if runner.file_writer is not None:  # the log rows handed over land first: a logger put back cuts them back
            runner.file_writer.wait()
        runner.restore_snapshot(snapshot)
        self._start_rng = snapshot.rng if snapshot.at_start else None
        raise RollBack()

    def _seen(self, entry: dict) -> str:
        """How ``entry``'s batch was rolled back past before (the same ordinal, or the same samples, of the same
        pass), else an empty string."""
        for old in self.skipped:
            if _pass_key_of(old) != _pass_key_of(entry) or old["world"] != entry["world"]:
                continue
            if old["ordinal"] == entry["ordinal"]:
                return f"at global batch {old['global_batch']}"
            if entry["samples"][0] is not None and all(
                    a is not None and b is not None and torch.equal(a, b)
                    for a, b in zip(old["samples"], entry["samples"])):
                return f"the same samples, as batch {old['ordinal']} at global batch {old['global_batch']}"
        return ""

    def rollbacks_in_pass(self, runner) -> int:
        """Rollbacks of the current pass of the current loader (its loader metric ``rollbacks``)."""
        key = _pass_key(runner)
        return sum(1 for entry in self.skipped if _pass_key_of(entry) == key)

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The skip list and the count, the same on every rank."""
        if not self.skipped:
            return {}
        return {"skipped": [dict(entry) for entry in self.skipped], "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = [dict(entry) for entry in state.get("skipped", [])]
        self.rollbacks = int(state.get("rollbacks", len(self.skipped)))


def keeper_of(runner) -> RollbackCallback:
    """The run's :class:`RollbackCallback`; ValueError before training when the chain has none."""
    for callback in runner.callbacks.values():
        if isinstance(callback, RollbackCallback):
            return callback
    raise ValueError("NonFiniteLossCallback(mode='rollback') needs the 'rollback' callback (RollbackCallback) in the "
                     "chain, which the run adds by itself; do not remove it (callbacks={'rollback': None})")


def _pass_key(runner) -> tuple:
    return runner.stage_key, runner.global_epoch_step, runner.loader_key


def _pass_key_of(entry: dict) -> tuple:
    return entry["stage"], entry["epoch"], entry["loader"]


def _mine(entry: dict, rank: int):
    samples = entry["samples"]
    return samples[rank] if rank < len(samples) else None


def _shown(samples: list) -> str:
    """``12, 40, 3 on rank 0; 5, 9, 81 on rank 1`` (at most :data:`SHOWN` each), or ``not recorded``."""
    parts = []
    for rank, indices in enumerate(samples):
        if indices is None:
            continue
        more = f", ... ({len(indices)} in all)" if len(indices) > SHOWN else ""
        shown = ", ".join(map(str, indices[:SHOWN])) + more
        parts.append(shown + (f" on rank {rank}" if len(samples) > 1 else ""))
    return "; ".join(parts) if parts else "not recorded: the loader has no sampler"


def _gradients_pending(runner) -> bool:
    """True while an optimizer of the run holds gradients (inside an accumulation group): a snapshot then would not
    hold them, so none is taken."""
    return any(p.grad is not None for optimizer in named(runner.optimizer, "optimizer").values()
               for group in optimizer.param_groups for p in group["params"])
