"""The memory plan before launch: each rank's bytes of parameters, gradients and optimizer state exactly as the
strategy shards them (run in a fake world inside this process), the activations autograd keeps, the peak; in
seconds, without a world, from a model on the meta device."""
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.helpers import tiny_run
from torchstage import FSDP, Callback, ModelParallel
from torchstage.strategies.memory_plan import activation_bytes, optimizer_factor, plan_memory

MIB = 2 ** 20


class Block(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, width=64, depth=3):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


def meta_net(**kwargs):
    with torch.device("meta"):
        return Net(**kwargs)


def floats(n):
    return 4 * n


BLOCK = 64 * 256 + 256 + 256 * 64 + 64  # parameters of one block
HEAD = 64 + 1


def test_ddp_holds_everything_and_its_gradient_buckets():
    model = meta_net()
    plan = plan_memory(model, "ddp", 4, optimizer=torch.optim.AdamW(model.parameters()), device="cpu")
    rank = plan.ranks[0]
    total = floats(3 * BLOCK + HEAD)
    assert (rank.params, rank.grads, rank.buffers) == (total, total, total)
    assert rank.optimizer == 2 * total + 4 * 14  # exp_avg and exp_avg_sq, and the step of each of 14 tensors
    assert len(plan.ranks) == 4 and not dist.is_initialized()


def test_fsdp_shards_each_tensor_by_rows_as_fully_shard_does():
    model = meta_net()
    started = time.perf_counter()
    plan = plan_memory(model, FSDP(modules=Block), 4, optimizer=torch.optim.SGD(model.parameters(), lr=0.1,
                                                                                momentum=0.9), device="cpu")
    assert time.perf_counter() - started < 30 and not dist.is_initialized()
    # every tensor split by rows over 4 (the head's one row and bias: rank 0 holds them; FSDP pads the others)
    shard = floats(3 * (BLOCK // 4) + 64 + 1)
    rank = plan.ranks[0]
    assert rank.params == rank.grads == rank.optimizer == shard  # momentum: one tensor per parameter
    # working buffers: the root (the head, whole), two blocks gathered (computing, prefetched), one block's gradients
    assert rank.buffers == floats(HEAD + 3 * BLOCK)
    assert "shard 4" in str(plan) and "0-3" in str(plan)


def test_tensor_parallel_then_fsdp_gives_each_rank_its_part():
    model = meta_net()
    strategy = ModelParallel(tensor=2, plan={"blocks.*.up": "colwise", "blocks.*.down": "rowwise"},
                             modules=Block)
    plan = plan_memory(model, strategy, 4, optimizer=torch.optim.AdamW(model.parameters()), device="cpu")
    rank = plan.ranks[3]
    # per block: up (256 x 64 + 256) and down's weight split over 2 tensor ranks, down's bias whole; then by 2 rows
    # (the head's one row and bias: FSDP pads every shard to the first's size)
    tp_block = (64 * 256 + 256) // 2 + (256 * 64) // 2 + 64
    assert rank.params == floats(3 * tp_block // 2 + 64 + 1)
    assert "shard 2 x tensor 2" in str(plan)


def test_optimizer_state_per_parameter():
    params = [nn.Parameter(torch.zeros(2))]
    assert optimizer_factor(torch.optim.AdamW(params))[0] == 2
    assert optimizer_factor(torch.optim.SGD(params, lr=0.1, momentum=0.9)) == (1, 0)
    assert optimizer_factor(torch.optim.SGD(params, lr=0.1)) == (0, 0)
    assert optimizer_factor(None) == (0, 0)


def test_activations_are_what_autograd_keeps_once_per_storage_and_checkpointing_keeps_block_inputs():
    model = meta_net(depth=3)
    x = torch.randn(8, 64)
    kept, largest = activation_bytes(model, x)
    # per block: its input (saved by up), relu's output (saved by relu and by down: one storage); the head's input
    per_block = floats(8 * 64 + 8 * 256)
    assert kept == 3 * per_block + floats(8 * 64) and largest == floats(8 * 256)
    checkpointed, _ = activation_bytes(model, x, classes=(Block,))
    assert checkpointed == 3 * floats(8 * 64) + per_block + floats(8 * 64)


def test_train_dry_run_plans_without_starting_a_world_or_training():
    class NoBatch(Callback):
        def on_batch_start(self, runner):
            raise AssertionError("a batch ran")

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 1024), nn.ReLU(), nn.Linear(1024, 1))
    runner = tiny_run(model, strategy="fsdp", distributed=True, nprocs=4, dry_run=True, callbacks=[NoBatch()])
    plan = runner.memory_plan
    assert plan.world_size == 4 and plan.ranks[0].params == floats((4 * 1024 + 1024) // 4 + 1024 + 1)
    assert plan.ranks[0].activations > 0 and runner.engine is None


def test_a_pipeline_plans_each_ranks_stages_sharded_over_its_data_parallel_ranks():
    """Under a pipeline each rank holds its stages' part of the model (issue 58), sharded over its data-parallel
    ranks; alone (no data-parallel ranks) nothing is gathered."""
    from torchstage import Pipeline

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(16, 1024)
            self.blocks = nn.ModuleList(nn.Linear(1024, 1024) for _ in range(6))
            self.head = nn.Linear(1024, 1)

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    with torch.device("meta"):
        model = Net()
    mib = 2 ** 20
    first = (16 * 1024 + 1024 + 3 * (1024 * 1024 + 1024)) * 4  # embed and blocks 0-2: stage 1 of 2
    second = (3 * (1024 * 1024 + 1024) + 1024 + 1) * 4  # blocks 3-5 and the head
    alone = plan_memory(model, strategy=Pipeline(2, n_microbatches=2), world_size=2, optimizer=torch.optim.AdamW)
    assert [round(r.params / mib, 2) for r in alone.ranks] == [round(first / mib, 2), round(second / mib, 2)]
    assert all(r.buffers == 0 for r in alone.ranks)
    shared = plan_memory(model, strategy=Pipeline(2, n_microbatches=2), world_size=4, optimizer=torch.optim.AdamW)
    assert [round(r.params / mib, 1) for r in shared.ranks] == [round(first / 2 / mib, 1)] * 2 + \
        [round(second / 2 / mib, 1)] * 2
