"""resume_iterator yields exactly the rest of an interrupted pass, skips by index without reading, restores RNG."""
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler

from torchstage.data.loader_rng import capture_loader_rng
from torchstage.data.resume import resume_iterator
from torchstage.rng import get_rng_state


class Counted(Dataset):
    """Returns its index plus noise from the global RNG, and counts reads."""

    def __init__(self, n=23):
        self.n, self.reads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return torch.tensor([float(i)]), torch.rand(1)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(10.0).split(1))


def _interrupted_pass(loader, skip):
    """The uninterrupted pass, plus what a checkpoint after ``skip`` batches would hold."""
    start = capture_loader_rng(loader)
    batches, mid, after_mid = [], None, None
    for i, batch in enumerate(loader, 1):
        batches.append(batch)
        torch.rand(3)  # the model's own draws (dropout) between batches
        if i == skip:
            mid = get_rng_state()
    after_mid = torch.rand(2)
    return batches, start, mid, after_mid


def _consume(batches):
    """Read a resumed pass the way the run does, with the model's draws between batches."""
    out = []
    for batch in batches:
        out.append(batch)
        torch.rand(3)
    return out


def _same(a, b):
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


@pytest.mark.parametrize("make", [
    lambda: DataLoader(Counted(), batch_size=4, shuffle=True),
    lambda: DataLoader(Counted(), batch_size=4, shuffle=True, drop_last=True),
    lambda: DataLoader(Counted(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)),
    lambda: DataLoader(Counted(), batch_size=None, sampler=RandomSampler(range(23))),
    lambda: DataLoader(Counted(), batch_size=4, shuffle=True, num_workers=2),
], ids=["global-rng", "drop-last", "explicit-generator", "no-batching", "two-workers"])
def test_rest_of_the_pass_is_identical_and_skipped_batches_are_not_read(make):
    torch.manual_seed(11)
    loader = make()
    reference, start, mid, _ = _interrupted_pass(loader, skip=3)
    torch.manual_seed(999)  # the resumed process starts from another state
    fresh = make()
    if isinstance(fresh.generator, torch.Generator):
        fresh.generator.manual_seed(12345)
    dataset = fresh.dataset
    rest = _consume(resume_iterator(fresh, 3, start, mid))
    assert len(rest) == len(reference) - 3
    if fresh.num_workers == 0:  # per-sample noise is drawn in this process only without workers
        assert _same(rest, reference[3:])
        assert dataset.reads == sum(len(b[0]) if fresh.batch_size else 1 for b in reference[3:])
    else:
        assert _same([b[0] for b in rest], [b[0] for b in reference[3:]])  # the same order


def test_the_run_rng_continues_from_the_checkpoint():
    torch.manual_seed(5)
    loader = DataLoader(Counted(), batch_size=4, shuffle=True)
    _, start, mid, after = _interrupted_pass(loader, skip=6)  # the pass has 6 batches: resume at its end
    torch.manual_seed(1)
    assert list(resume_iterator(DataLoader(Counted(), batch_size=4, shuffle=True), 6, start, mid)) == []
    assert torch.equal(torch.rand(2), after)


def test_persistent_workers_later_epoch_keeps_the_order():
    def make():
        return DataLoader(Counted(), batch_size=4, shuffle=True, num_workers=1, persistent_workers=True)
    torch.manual_seed(2)
    loader = make()
    list(loader)  # epoch 1 creates the persistent iterator; epoch 2 only resets it
    reference, start, mid, _ = _interrupted_pass(loader, skip=2)
    assert start["fresh_iterator"] is False
    torch.manual_seed(3)
    fresh = make()
    rest = list(resume_iterator(fresh, 2, start, mid))
    assert _same([b[0] for b in rest], [b[0] for b in reference[2:]])
    assert len(list(fresh)) == len(reference)  # later passes are whole again


@pytest.mark.parametrize("make", [lambda: DataLoader(Stream(), batch_size=3),
                                  lambda: [torch.tensor([i]) for i in range(5)]], ids=["iterable-dataset", "list"])
def test_other_iterables_are_replayed(make):
    reference, start, mid, _ = _interrupted_pass(make(), skip=2)
    assert _same(_consume(resume_iterator(make(), 2, start, mid)), reference[2:])


def test_a_dataloader_keeps_its_own_sampler_after_resuming():
    loader = DataLoader(Counted(), batch_size=4, shuffle=True)
    sampler = loader.batch_sampler
    _, start, mid, _ = _interrupted_pass(loader, skip=1)
    list(resume_iterator(loader, 1, start, mid))
    assert loader.batch_sampler is sampler and len(loader) == 6
