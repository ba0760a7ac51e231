"""Every rank must run as many training batches as the others: DDP syncs gradients at each one.

Checked at each training loader's start from the loaders' lengths (one tiny all-gather on a CPU group
of its own), so uneven shards fail before their first batch with the counts of every rank, instead of
gloo's "Received data size doesn't match" abort or a hang at the epoch's end. A loader without a length
is checked at its end: equal counts pass; a rank that ran out early waits there (on its own group, so it
cannot mismatch DDP's collectives) until the hang watchdog ends the job, naming where each rank was.
"""
import torch
import torch.distributed as dist

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope

FIX = ("every rank needs the same number of training batches (DDP synchronises gradients at each one): "
       "give torchstage a DataLoader over a map-style dataset (it shards it evenly), or shard it yourself "
       "with DistributedSampler(..., drop_last=True) or an IterableDataset that yields as many batches on "
       "every rank")


class UnevenBatchesError(RuntimeError):
    """The ranks of a run would run different numbers of training batches."""


class EvenBatchesCallback(Callback):
    """Fails a distributed run whose training loaders give the ranks different batch counts."""

    order = CallbackOrder.Internal
    scope = CallbackScope.Distributed  # no cost in a single process

    def __init__(self):
        self._group, self._unknown = None, False

    def on_experiment_start(self, runner):
        if runner.engine.is_distributed:
            self._group = dist.new_group(backend="gloo")

    def on_loader_start(self, runner):
        if self._group is None or not runner.loop.is_train_loader:
            return
        try:
            size = len(runner.loop.loader)
        except TypeError:
            size = -1
        counts = self._gather(size)
        if min(counts) >= 0 and min(counts) != max(counts):
            raise UnevenBatchesError(f"loader {runner.loop.loader_key!r} has a different number of batches on each "
                                     f"rank ({_per_rank(counts)}); {FIX}")
        self._unknown = min(counts) < 0

    def on_loader_end(self, runner):
        if self._group is None or not runner.loop.is_train_loader or not self._unknown:
            return
        counts = self._gather(runner.loop.batch_step or 0)
        if min(counts) != max(counts):
            raise UnevenBatchesError(f"loader {runner.loop.loader_key!r} ended after a different number of batches on "
                                     f"each rank ({_per_rank(counts)}); {FIX}")

    def on_experiment_end(self, runner):
        self._release()

    def on_exception(self, runner):
        self._group = None  # a failing rank leaves its groups alone (its peers may still use them)

    def _release(self):
        # Not destroyed here: tearing a gloo group down while a peer finishes its run raced at exit (a rank
        # aborted with "terminate called without an active exception" after many runs in one world, as a
        # tune study does); the world's destroy_process_group() at its end destroys every group.
        self._group = None

    def _gather(self, value: int) -> list:
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(self._group))]
        dist.all_gather(out, torch.tensor([value], dtype=torch.int64), group=self._group)
        return [int(t) for t in out]


def _per_rank(counts: list) -> str:
    return ", ".join(f"rank {rank}: {'unknown' if n < 0 else n}" for rank, n in enumerate(counts))
