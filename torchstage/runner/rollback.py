"""Rollbacks: back to the last clean check and on without the bad batch, exactly as if the loader never gave it.

The runner keeps one :class:`RollbackCallback` per run (``runner.rollback``), in the chain as ``rollback`` in every
stage whose callbacks may roll the run back (:meth:`~torchstage.runner.shared.Shared.allow_rollbacks`: a
:class:`~torchstage.callbacks.training.nonfinite.NonFiniteLossCallback` with ``mode="rollback"``). It takes an
in-memory snapshot of the run (see :mod:`torchstage.runner.snapshot`) as each train loader starts and after a clean
check (every ``check_every`` batches, before each checkpoint), at most once a second (:data:`SNAPSHOT_PERIOD`,
agreed by the ranks in the check's all-reduce). A rollback, step by step:

1. a check finds the first bad batch and asks for a rollback (:meth:`RollbackCallback.request`): the batch joins the
   skip list and its pass (a :class:`TrainPass`, ``runner.loop.train_pass``) is marked to end;
2. the pass ends through the loader's cancel, :class:`~torchstage.callbacks.base.RollBack`: raised by the check in its
   own event, or by this callback once the batch's other callbacks are done when the check ran before a save (which
   then writes nothing); every callback gets ``on_loader_end``, the loggers leave the pass's loader metrics out;
3. the loop (``Runner._run_loader``) asks :meth:`RollbackCallback.restore`: every rank puts its snapshot back and the
   loader starts again from that point, as a run resumed there from a checkpoint would;
4. as it starts, :meth:`RollbackCallback.on_loader_start` opens the new pass, whose skip list leaves the bad batch out
   by its ordinal in the pass, never read again (``Runner._run_batches`` hands it to the loader).

A run that rolls back past batch k ends as a run whose loader yields the same batches without batch k. The skip list
is kept in checkpoints, so a resumed or restarted run skips those batches too; it counts the rollbacks of the run, at
most ``max_rollbacks``, and stops (as ``mode="stop"`` does) at the next one or at the same batch twice.
"""
import logging
import time
from dataclasses import dataclass
from typing import Optional

import torch

from torchstage.callbacks.base import Callback, RollBack
from torchstage.callbacks.safety.stop import StopCallback
from torchstage.data.skips import PassFilter, sample_indices
from torchstage.one_or_many import named
from torchstage.rng import set_rng_state
from torchstage.runner.snapshot import Snapshot

logger = logging.getLogger("torchstage")
#: After every callback but the straggler detector (whose step includes the snapshot) and after the graceful stop,
#: which ends the run at this batch, written over no rollback: a snapshot holds what every callback did with a batch.
ROLLBACK_ORDER = StopCallback.order + 5
#: Sample indices shown per rank in a rollback's log line (all are kept in the skip list).
SHOWN = 32
#: Seconds between two snapshots at least (besides the one as each train loader starts): where a check comes every
#: few milliseconds, a snapshot at each would cost a share of the run; a rollback then goes back a little further.
SNAPSHOT_PERIOD = 1.0


@dataclass
class TrainPass:
    """One pass of a train loader in a run that may roll back: which pass it is, what it leaves out and drew, and
    where a rollback of it goes back to (``runner.loop.train_pass``)."""

    key: tuple  #: ``(stage, global epoch, loader)``
    skips: PassFilter  #: the batches of the skip list it leaves out, and what it drew (:mod:`torchstage.data.skips`)
    snapshot: Snapshot  #: where a rollback of it goes back to
    mid_pass: bool  #: snapshots after clean checks are taken (a pass that resumes by index)
    taken: float  #: ``time.monotonic()`` of the snapshot
    clean_at: Optional[int] = None  #: the batch (``batch_step``) after which a clean check asked for a snapshot
    rolled_back: Optional[dict] = None  #: the skip-list entry of the rollback that ends it (None: it goes on)


class RollbackCallback(Callback):
    """The run's rollback keeper: takes the snapshots a rollback goes back to, puts them back, and keeps the skip
    list (see the module)."""

    order = ROLLBACK_ORDER
    name = "rollback"
    train_batches_only = True

    def __init__(self):
        self.skipped = []  #: the batches left out: where, why, and the samples each rank held there
        self.rollbacks = 0  #: rollbacks of the run
        self._copies = None  # the last snapshot: the next one copies into its tensors

    def attach(self, shared) -> None:
        shared.add_rollback_keeper(self)  # runner.rollback: the checks ask it, the loop has it put a snapshot back
        shared.add_save_check(self._not_while_rolling_back)

    # ---- before training -------------------------------------------------------------------------
    def on_experiment_start(self, runner):
        why = runner.strategy.no_snapshots
        if why:
            raise ValueError(f"NonFiniteLossCallback(mode='rollback') keeps an in-memory snapshot of the models and "
                             f"optimizers, and strategy={runner.strategy!r} cannot give one: {why}. Use "
                             f"mode='stop' (the run stops at a bad loss and resumes from its last checkpoint), or "
                             f"strategy='ddp' or 'fsdp'")
        for stage, loaders in zip(runner.spec.stage_specs, runner.stage_loaders):
            for name, loader in loaders.items():
                if name.startswith("train") and callable(getattr(loader, "load_state_dict", None)):
                    raise ValueError(f"NonFiniteLossCallback(mode='rollback') replays a train loader's pass by index "
                                     f"from where it started; loader {name!r} of stage {stage.name!r} is a stateful "
                                     f"{type(loader).__name__}, which resumes from its own state: use mode='stop', or "
                                     f"a plain DataLoader")

    # ---- a pass and its snapshots ----------------------------------------------------------------
    def on_loader_start(self, runner):
        loop = runner.loop
        ended, loop.train_pass = loop.train_pass, None
        if not loop.is_train_loader:
            return
        if ended is not None and ended.rolled_back is not None and ended.snapshot.at_start:
            set_rng_state(ended.snapshot.rng)  # back at the pass's start: its draws begin where the snapshot's did
        key, world, rank = _pass_key(runner), runner.engine.world_size, runner.engine.rank
        drop = {entry["ordinal"]: _mine(entry, rank) for entry in self.skipped
                if _pass_key_of(entry) == key and entry["world"] == world}
        point = loop.resume_point
        # mid-pass snapshots resume by index; a pass dealt out anew on resume goes back to its start only
        mid_pass = point is None or not (point.indices is not None or point.by_samples or point.loader_restored)
        self._copies = runner.take_snapshot(at_start=True, leave_out=(self.name,), reuse=self._copies)
        loop.train_pass = TrainPass(key, PassFilter(drop), self._copies, mid_pass, time.monotonic())

    def snapshot_due(self, runner) -> bool:
        """Whether this rank would take a snapshot after a clean check now: inside a train pass that resumes by index,
        at least :data:`SNAPSHOT_PERIOD` seconds after the last one (the ranks agree on it with the check)."""
        train_pass = runner.loop.train_pass
        return (train_pass is not None and train_pass.mid_pass
                and time.monotonic() - train_pass.taken >= SNAPSHOT_PERIOD)

    def clean(self, runner) -> None:
        """A check found the pass clean up to this batch and the ranks agreed on a snapshot: it is taken after this
        batch's other callbacks (by :meth:`on_batch_end`)."""
        if runner.loop.train_pass is not None:
            runner.loop.train_pass.clean_at = runner.loop.batch_step

    def on_batch_end(self, runner):
        loop = runner.loop
        train_pass = loop.train_pass
        if train_pass.rolled_back is not None:  # asked for by a check before a save: the pass ends after this batch
            raise RollBack()
        if not train_pass.mid_pass or train_pass.clean_at != loop.batch_step \
                or train_pass.snapshot.batch == loop.batch_step:
            return
        if _gradients_pending(runner):  # inside an accumulation group: the snapshot could not hold the gradients
            return
        self._copies = runner.take_snapshot(at_start=False, leave_out=(self.name,), reuse=self._copies)
        train_pass.snapshot, train_pass.taken = self._copies, time.monotonic()
        train_pass.skips.forget(loop.batch_step)

    def on_loader_end(self, runner):
        train_pass = runner.loop.train_pass
        if train_pass is not None and train_pass.rolled_back is None:
            runner.loop.train_pass = None  # a pass rolled back stays, for restore() and the loader's new start

    # ---- a rollback ------------------------------------------------------------------------------
    def request(self, runner, finding: dict, what: str, limit: int) -> None:
        """Roll the run back past ``finding``'s batch: it joins the skip list and its pass is marked to end (through
        :class:`~torchstage.callbacks.base.RollBack`; the loop then calls :meth:`restore`). Raise ``finding["error"]``
        instead when that would be rollback ``limit + 1``, the same batch twice, or no train pass is under way.
        Collective: every rank asks at the same check; asking again for the same pass does nothing."""
        loop, engine = runner.loop, runner.engine
        train_pass = loop.train_pass
        if train_pass is not None and train_pass.rolled_back is not None:
            return
        drawn = train_pass.skips.drawn if train_pass is not None else {}
        ordinal, item = drawn.get(finding["position"], (None, None))
        samples = engine.all_gather_object(sample_indices(item))
        entry = {"stage": loop.stage_key, "epoch": loop.global_epoch_step, "loader": loop.loader_key,
                 "ordinal": ordinal, "world": engine.world_size, "global_batch": finding["step"],
                 "reason": what, "samples": [None if s is None else torch.tensor(s, dtype=torch.int64)
                                             for s in samples]}
        again = self._seen(entry)
        if again or self.rollbacks >= limit or ordinal is None:
            why = (f"batch {ordinal} of this pass was rolled back past before ({again})" if again else
                   "no train loader's pass is under way" if train_pass is None else
                   "its ordinal in the pass is unknown" if ordinal is None else
                   f"it would be rollback {self.rollbacks + 1}, over max_rollbacks={limit}")
            raise finding["error"](f"{what}; not rolled back: {why}, so the run stops here (the last checkpoint "
                                   f"holds no weights trained on it)", origin_rank=finding["rank"])
        self.skipped.append(entry)
        self.rollbacks += 1
        train_pass.rolled_back = entry
        if engine.is_main:
            snapshot = train_pass.snapshot
            back = ("the loader's start" if snapshot.at_start and snapshot.resume_point is None else
                    "where the loader resumed" if snapshot.at_start else "the snapshot after a clean check")
            logger.warning("rollback %d of at most %d: %s; back to global batch %d (%s, batch %d of loader %r); the "
                           "pass goes on without that batch (ordinal %d of the pass; samples %s)", self.rollbacks,
                           limit, what, snapshot.global_batch, back, snapshot.batch, snapshot.loader, ordinal,
                           _shown(samples))

    def restore(self, runner) -> bool:
        """After a pass's ``on_loader_end``: when a rollback ended it, put its snapshot back (the loader then starts
        again from there) and return True."""
        train_pass = runner.loop.train_pass
        if train_pass is None or train_pass.rolled_back is None:
            return False
        if runner.file_writer is not None:  # the log rows handed over land first: a logger put back cuts them back
            runner.file_writer.wait()
        runner.restore_snapshot(train_pass.snapshot)
        return True

    def _not_while_rolling_back(self, runner):
        """A save check: nothing is written while a pass is being rolled back (its state holds the bad batch)."""
        train_pass = runner.loop.train_pass
        return None if train_pass is None or train_pass.rolled_back is None else "the pass is being rolled back"

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


def _pass_key(runner) -> tuple:
    return runner.loop.stage_key, runner.loop.global_epoch_step, runner.loop.loader_key


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
