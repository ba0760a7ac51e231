"""The run's loop state, declared in one place: position, counters, metrics, resume point and stop request.

The runner holds one :class:`LoopState` (``runner.loop``) and exposes each field as an attribute
(``runner.epoch``, ``runner.batch_step``...), so user code reads and writes them either way. Inside the library
they are spelled one way, ``runner.loop.<field>``: a runner subclass may give ``runner.<field>`` a meaning of its
own (Catalyst 22's ``IRunner.batch_step`` counts the whole run's batches), the loop state never changes meaning.
"""
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Optional

from torchstage.stop_request import StopRequest


class EpochMetrics(dict):
    """``{loader: {metric: value}}`` of the current epoch, written by the loop."""


@dataclass
class ResumePoint:
    """Where a mid-epoch checkpoint stopped inside its loader, and what that loader pass had so far."""

    loader: str  #: the interrupted loader
    batch: int  #: batches of it already done
    train_batches_done: int  #: train batches done in the epoch
    loader_sample_step: int  #: samples of the loader already done
    metrics: dict  #: epoch metrics of the loaders already finished in that epoch
    loader_rng: dict  #: the random state the loader pass started from (replays its order)
    rng: dict  #: this rank's generator states at the checkpoint
    loader_restored: bool = False  #: a stateful loader was put back where it was: no index skipping
    by_samples: bool = False  #: the loader's batch size changed: the pass goes on after its done samples
    indices: Optional[list] = None  #: this rank's samples left of a pass resumed on another number of processes


@dataclass
class LoopState:
    """Everything the loop advances; a fresh one is a run that has not started."""

    stage_index: int = 0
    stage_key: Optional[str] = None
    num_epochs: int = 0
    loaders: dict = field(default_factory=dict)
    epoch: int = 0  #: epoch within the stage, 1-based while running
    epoch_done: bool = True
    loader_key: Optional[str] = None
    loader: Any = None
    is_train_loader: bool = False
    batch: Any = None
    batch_step: Optional[int] = None  #: batch within the loader, 1-based (None before the first batch)
    batch_size: int = 0
    batch_skipped: bool = False  #: a callback left this batch out of averages, backward and step
    loader_sample_step: int = 0
    train_batches_done: int = 0  #: train batches done in this epoch
    global_epoch_step: int = 0
    global_batch_step: int = 0
    global_sample_step: int = 0
    run_batch_step: int = 0  #: batches of every loader so far in this process's run (Catalyst 22's batch_step)
    run_sample_step: int = 0  #: samples of every loader so far in this process's run (Catalyst 22's sample_step)
    batch_metrics: dict = field(default_factory=dict)
    loader_metrics: dict = field(default_factory=dict)
    epoch_metrics: EpochMetrics = field(default_factory=EpochMetrics)
    periodic_metrics: dict = field(default_factory=dict)  #: results of mid-epoch validation
    periodic_step: Optional[int] = None  #: global batch step of the last mid-epoch validation
    loader_start_rng: Optional[dict] = None  #: random state the current loader pass started from
    resume_point: Optional[ResumePoint] = None  #: set by resume until the interrupted loader restarts
    #: the current train pass of a run that may roll back (a :class:`~torchstage.runner.rollback.TrainPass`: what it
    #: leaves out and drew, its snapshot); None otherwise
    train_pass: Any = None
    stop_request: Optional[StopRequest] = None  #: the graceful stop every rank agreed on

    def rolling_back(self) -> bool:
        """Whether a rollback ended the current train pass: what it did is thrown away, and nothing logs it."""
        return self.train_pass is not None and self.train_pass.rolled_back is not None

    def position(self) -> dict:
        """Where the run stands, as the checkpoint's ``loop`` entry (plain values)."""
        return {"stage": self.stage_key, "stage_index": self.stage_index, "epoch": self.epoch,
                "epoch_done": self.epoch_done, "batch": self.train_batches_done, "loader": self.loader_key,
                "loader_batch": self.batch_step or 0, "loader_sample_step": self.loader_sample_step,
                "loader_samples": dataset_size(self.loader),
                "global_epoch_step": self.global_epoch_step, "global_batch_step": self.global_batch_step,
                "global_sample_step": self.global_sample_step}


LOOP_FIELDS = tuple(f.name for f in fields(LoopState))


def dataset_size(loader):
    """The number of samples of ``loader``'s dataset (over all ranks), or None where it has no sized dataset."""
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return None


def expose_loop_state(cls):
    """Class decorator: each :class:`LoopState` field becomes a read/write attribute of ``cls`` (via ``self.loop``)."""
    for name in LOOP_FIELDS:
        if hasattr(cls, name):  # the class defines it itself
            continue
        get = attrgetter(f"loop.{name}")
        setattr(cls, name, property(get, _setter(name), doc=f"``runner.loop.{name}``"))
    return cls


def _setter(name):
    if name == "epoch_metrics":  # a dict assigned (a checkpoint's metrics) becomes the runner's mapping type
        def set_metrics(self, value):
            kind = self.epoch_metrics_type
            self.loop.epoch_metrics = value if isinstance(value, kind) or value is None else kind(value)
        return set_metrics

    def set_field(self, value):
        setattr(self.loop, name, value)
    return set_field
