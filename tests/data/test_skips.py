"""A pass filter leaves the batches of a skip list out of a loader's pass by ordinal, never reading them, records what
the pass drew, and survives resumes and persistent workers."""
import logging

import torch
from torch.utils.data import DataLoader, Dataset

from torchstage.data.loader_rng import capture_loader_rng
from torchstage.data.resume import filtered_pass, resume_iterator
from torchstage.data.skips import PassFilter, sample_indices
from torchstage.rng import get_rng_state


class Counted(Dataset):
    """Its index, and which indices were read."""

    def __init__(self, n=20):
        self.n, self.read = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.read.append(i)
        return torch.tensor([i])


def ids(batches) -> list:
    return [batch.reshape(-1).tolist() for batch in batches]


def test_a_filtered_pass_leaves_out_its_ordinals_unread_and_records_the_rest():
    data = Counted()
    loader = DataLoader(data, batch_size=3, shuffle=True)
    torch.manual_seed(5)
    whole = ids(loader)
    data.read.clear()
    pass_filter = PassFilter({2: None, 5: None})
    torch.manual_seed(5)
    kept = ids(filtered_pass(loader, lambda: pass_filter))
    assert kept == [whole[i] for i in (0, 2, 3, 5, 6)]  # ordinals 2 and 5 left out
    assert sorted(data.read) == sorted(i for batch in kept for i in batch)  # never read
    assert {position: (ordinal, sample_indices(item)) for position, (ordinal, item) in pass_filter.drawn.items()} == \
        {1: (1, whole[0]), 2: (3, whole[2]), 3: (4, whole[3]), 4: (6, whole[5]), 5: (7, whole[6])}
    pass_filter.forget(3)
    assert sorted(pass_filter.drawn) == [4, 5] and len(pass_filter) == 2
    assert len(loader) == 7  # the loader itself is left as it was


def test_a_batch_of_the_skip_list_holding_other_samples_now_is_trained(caplog):
    loader = DataLoader(Counted(), batch_size=4)
    pass_filter = PassFilter({1: torch.tensor([0, 1, 2, 3]), 2: torch.tensor([9, 9, 9, 9])})
    with caplog.at_level(logging.WARNING, logger="torchstage"):
        kept = ids(filtered_pass(loader, lambda: pass_filter))
    assert kept[0] == [4, 5, 6, 7] and len(kept) == 4  # ordinal 1 left out; ordinal 2 held 4..7, not 9s: trained
    assert pass_filter.unmatched == [2] and "batch 2 of this pass holds other samples" in caplog.text


def test_a_filtered_pass_resumed_mid_way_gives_the_rest_with_the_random_state_of_the_interruption():
    loader = DataLoader(Counted(23), batch_size=2, shuffle=True)
    torch.manual_seed(1)
    start = capture_loader_rng(loader)
    first = PassFilter({3: None})
    batches, mid = [], None
    for position, batch in enumerate(filtered_pass(loader, lambda: first), 1):
        batches.append(batch)
        torch.rand(2)  # the model's own draws
        if position == 4:
            mid = get_rng_state()
    second = PassFilter({3: None, 7: None})  # a rollback after position 4 left out ordinal 7 too
    rest = ids(resume_iterator(loader, 4, start, mid, source=lambda: second))
    assert rest == [b for i, b in enumerate(ids(batches)[4:], 5) if i != 6]  # kept position 6 was ordinal 7
    assert second.drawn[5][0] == 6 and second.drawn[6][0] == 8


def test_an_iterable_is_read_and_its_left_out_batches_dropped_by_ordinal():
    batches = [torch.tensor([i]) for i in range(6)]
    pass_filter = PassFilter({1: None, 4: None})
    assert ids(filtered_pass(batches, lambda: pass_filter)) == [[1], [2], [4], [5]]
    assert pass_filter.drawn[1] == (2, None)


def test_a_persistent_iterator_asks_each_pass_for_its_filter_and_a_foreign_one_is_replaced():
    data = Counted(8)
    loader = DataLoader(data, batch_size=2, num_workers=1, persistent_workers=True)
    assert ids(loader) == [[0, 1], [2, 3], [4, 5], [6, 7]]  # made with the plain sampler: foreign to the filter
    current = {"filter": PassFilter({2: None})}
    from torchstage.data.resume import discard_persistent_iterator
    discard_persistent_iterator(loader, unless_filtered=True)
    assert loader._iterator is None
    assert ids(filtered_pass(loader, lambda: current["filter"])) == [[0, 1], [4, 5], [6, 7]]
    kept = loader._iterator
    discard_persistent_iterator(loader, unless_filtered=True)
    assert loader._iterator is kept  # it asks the filter of each pass
    current["filter"] = PassFilter({4: None})
    assert ids(filtered_pass(loader, lambda: current["filter"])) == [[0, 1], [2, 3], [4, 5]]
    current["filter"] = None
    assert ids(loader) == [[0, 1], [2, 3], [4, 5], [6, 7]]  # no filter (a validation pass): as it is
    discard_persistent_iterator(loader)
