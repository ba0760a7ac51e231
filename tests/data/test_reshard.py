"""The epoch order a pass drew, rebuilt for a resume on another number of processes, and the rest dealt out."""
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from torchstage.data.reshard import dealt, epoch_order, pass_order
from torchstage.data.loader_rng import capture_loader_rng


def _drawn(loader) -> list:
    start = capture_loader_rng(loader)
    return start, [int(i) for batch in loader for i in batch[0]]


@pytest.mark.parametrize("generator", [None, 7], ids=["global generator", "the loader's generator"])
def test_a_shuffled_pass_of_one_process_is_replayed_from_its_starting_state(generator):
    torch.manual_seed(3)
    loader = DataLoader(TensorDataset(torch.arange(30)), batch_size=4, shuffle=True,
                        generator=None if generator is None else torch.Generator().manual_seed(generator))
    next(iter(loader))  # the generators have moved on since the run began
    start, order = _drawn(loader)
    torch.manual_seed(99)  # whatever the state now: the replay uses the pass's own
    assert epoch_order(30, 1, True, None, 4, start) == order


def test_several_processes_deal_the_order_as_distributed_sampler_does():
    order = epoch_order(10, 3, True, 5, 2)
    assert len(order) == 12  # padded to a multiple of 3
    for rank in range(3):
        sampler = DistributedSampler(range(10), num_replicas=3, rank=rank, shuffle=True, seed=5)
        sampler.set_epoch(2)
        assert order[rank::3] == list(sampler)


def test_the_rest_is_dealt_again_and_a_second_resume_goes_on_from_the_first():
    base = {"size": 10, "world": 2, "shuffle": True, "seed": 1, "epoch": 0, "loader_rng": None}
    first = epoch_order(**base)
    once = pass_order(base, [[4, 3]])  # 4 done by 2 processes, the 6 left dealt to 3
    assert once == first[4:]
    twice = pass_order(base, [[4, 3], [3, 2]])  # then 1 each done by the 3, the 3 left dealt to 2 (padded)
    assert twice == dealt(once[3:], 2) == once[3:] + once[3:4]
