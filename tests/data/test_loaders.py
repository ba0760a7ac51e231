"""User loaders rebuilt per rank: options kept, shards disjoint and complete, custom samplers wrapped."""
import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, SequentialSampler, TensorDataset,
                              WeightedRandomSampler)

from torchstage.data.samplers import StridedEvalSampler
from torchstage import Engine
from torchstage.data.loaders import ShardedSampler, distribute_loader, distribute_loaders

DATA = TensorDataset(torch.arange(101).float())


def engines(n):
    return [Engine(device="cpu", rank=r, world_size=n) for r in range(n)]


def collate(items):
    return torch.stack([x for (x,) in items])


def worker_init(worker_id):
    pass


def ids(loader):
    return [int(v) for batch in loader for v in (batch[0] if isinstance(batch, list) else batch)]


def test_options_are_kept_and_batch_size_is_per_process():
    loader = DataLoader(DATA, batch_size=8, shuffle=True, collate_fn=collate, num_workers=1, drop_last=True,
                        worker_init_fn=worker_init, pin_memory=False, persistent_workers=True)
    train = distribute_loader(loader, engines(2)[1], is_train=True, seed=7)
    assert (train.batch_size, train.collate_fn, train.num_workers, train.drop_last, train.worker_init_fn,
            train.persistent_workers) == (8, collate, 1, True, worker_init, True)
    assert isinstance(train.sampler, DistributedSampler) and train.sampler.shuffle and train.sampler.seed == 7
    assert len(train) == 51 // 8


def test_evaluation_shards_read_every_sample_once():
    loader = DataLoader(DATA, batch_size=10)
    shards = [distribute_loader(loader, e, is_train=False) for e in engines(3)]
    assert all(isinstance(s.sampler, StridedEvalSampler) for s in shards)
    assert sorted(i for s in shards for i in ids(s)) == list(range(101))


def test_training_shards_are_padded_to_equal_lengths_and_cover_everything():
    shards = [distribute_loader(DataLoader(DATA, batch_size=4, shuffle=True), e, True, seed=3) for e in engines(3)]
    for s in shards:
        s.sampler.set_epoch(2)
    seen = [ids(s) for s in shards]
    assert [len(x) for x in seen] == [34, 34, 34] and set(sum(seen, [])) == set(range(101))


def test_custom_sampler_is_drawn_identically_on_every_rank_then_sharded():
    weights = torch.linspace(0.1, 1.0, 101)
    loaders = [distribute_loader(DataLoader(DATA, batch_size=5, sampler=WeightedRandomSampler(weights, 60)), e,
                                 True, seed=11) for e in engines(2)]
    torch.manual_seed(0)  # ranks are seeded differently (seed + rank): the draw must not depend on it
    first = ids(loaders[0])
    torch.manual_seed(1)
    second = ids(loaders[1])
    with torch.random.fork_rng():
        torch.manual_seed(11 + 0)
        expected = [int(i) for i in WeightedRandomSampler(weights, 60)]
    assert first == expected[0::2] and second == expected[1::2]
    for loader in loaders:
        loader.sampler.set_epoch(1)
    assert ids(loaders[0]) != first  # a new draw each epoch, still shared by the ranks
    assert isinstance(loaders[0].sampler, ShardedSampler) and len(loaders[0]) == 6


def test_global_random_state_is_untouched_by_the_shared_draw():
    sampler = ShardedSampler(WeightedRandomSampler(torch.ones(10), 10), 2, 0, seed=5)
    torch.manual_seed(123)
    list(sampler)
    after = torch.rand(1)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(1))


def test_custom_batch_sampler_is_sharded_by_batch():
    batches = BatchSampler(SequentialSampler(DATA), batch_size=10, drop_last=False)  # 11 batches
    loader = DataLoader(DATA, batch_sampler=batches)
    evals = [distribute_loader(loader, e, is_train=False) for e in engines(2)]
    assert [len(e) for e in evals] == [6, 5]
    assert sorted(sum((ids(e) for e in evals), [])) == list(range(101))
    trains = [distribute_loader(loader, e, is_train=True) for e in engines(2)]
    assert [len(t) for t in trains] == [6, 6]


def test_single_process_and_already_distributed_loaders_are_left_alone():
    loader = DataLoader(DATA, batch_size=4)
    one = Engine(device="cpu", rank=0, world_size=1)
    assert distribute_loader(loader, one, True) is loader
    mine = DataLoader(DATA, sampler=DistributedSampler(DATA, num_replicas=2, rank=0))
    assert distribute_loaders({"train": mine}, engines(2)[0])["train"] is mine
