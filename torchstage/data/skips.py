"""The batches a loader's pass leaves out (a rollback's skip list), and a record of what the pass drew.

A batch is named by its *ordinal* in the pass: 1 for the first item the loader's batch sampler gives (the first
batch of an iterable), whatever was left out before it. The loop numbers only the batches it trains
(``batch_step``), so after a batch is left out the two differ; :attr:`PassFilter.drawn` maps one to the other,
with the sample indices each batch held where the loader has a sampler (named in the rollback's log). A batch of
the skip list whose sample indices are known is left out only while its ordinal holds those same samples: a pass
dealt out otherwise (another number of processes, another batch size) is not shortened by ordinals of another.
"""
import logging

import torch

logger = logging.getLogger("torchstage")


class PassFilter:
    """What the current pass of a train loader leaves out, and what it drew.

    ``drop``: ordinal -> the sample indices this rank's batch held there (an int64 tensor), or None where the
    loader has no sampler. ``first_position``: the loop's ``batch_step`` of the first batch this pass gives (a
    pass resumed by another number of processes starts after the batches counted as done).
    """

    def __init__(self, drop: dict = None, first_position: int = 1):
        self.drop = dict(drop or {})
        self.first_position = first_position
        #: the loop's batch_step -> (ordinal in the pass, the sampler's item: sample indices, or None)
        self.drawn = {}
        self.unmatched = []  #: ordinals of the skip list whose batch holds other samples in this pass (kept)

    def apply(self, items, indexed: bool):
        """``items`` (a pass's sampler items when ``indexed``, else its batches) without those of the skip list;
        records the ordinal (and sampler item) of each one it gives."""
        position, drop, drawn = self.first_position, self.drop, self.drawn
        for ordinal, item in enumerate(items, 1):
            if drop and ordinal in drop and self._same(ordinal, item, indexed):
                continue
            drawn[position] = (ordinal, item if indexed else None)
            position += 1
            yield item

    def _same(self, ordinal: int, item, indexed: bool) -> bool:
        expected = self.drop[ordinal]
        if expected is None or not indexed:
            return True
        held = torch.as_tensor(item if isinstance(item, (list, tuple, torch.Tensor)) else [item]).reshape(-1)
        if held.dtype == expected.dtype and torch.equal(held, expected):
            return True
        if ordinal not in self.unmatched:
            self.unmatched.append(ordinal)
            logger.warning("skip list: batch %d of this pass holds other samples than the batch that was left out "
                           "there (the pass is dealt out otherwise now); it is trained", ordinal)
        return False

    def forget(self, position: int) -> None:
        """Drop the record of the batches up to the loop's ``position`` (a snapshot was taken after it)."""
        for key in [key for key in self.drawn if key <= position]:
            del self.drawn[key]

    def __len__(self) -> int:
        """How many batches this pass leaves out."""
        return len(self.drop)


def sample_indices(item) -> list:
    """The sample indices of a sampler's item (a batch's list, or one index) as ints; None for None."""
    if item is None:
        return None
    if isinstance(item, torch.Tensor):
        return [int(i) for i in item.reshape(-1).tolist()]
    if isinstance(item, (list, tuple)):
        return [int(i) for i in item]
    return [int(item)]
