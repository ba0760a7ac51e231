"""Mesh layouts of HSDP and ModelParallel, checked before training: degrees that do not make the world are refused
with both numbers; the engine's data-parallel place; loaders split by it (in process, no world needed)."""
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tests.helpers import tiny_run
from torchstage import FSDP, HSDP, Engine, ModelParallel
from torchstage.data.loaders import distribute_loader
from torchstage.distributed.layout import MeshLayout, complete
from torchstage.launch.world import World
from torchstage.strategies.mesh import total_norm
from torchstage.strategies.resolve import resolve_strategy


class Node:
    """A world of ``world`` processes with ``node`` on each node, as a launcher would give it (no process group)."""

    def __new__(cls, world, node, rank=0):
        return World(rank=rank, world_size=world, local_size=node)


def plan(model, mesh):
    return model


@pytest.mark.parametrize("strategy, world, node, layout", [
    (FSDP(replicate=2, shard=2), 4, 4, (2, 2, 1)),
    (FSDP(replicate=2), 4, 4, (2, 2, 1)),
    (FSDP(shard=2), 8, 8, (4, 2, 1)),
    (FSDP(), 4, 2, (1, 4, 1)),
    (HSDP(), 4, 2, (2, 2, 1)),  # shard within a node, replicate across nodes
    (HSDP(), 8, 4, (2, 4, 1)),
    (HSDP(), 4, 4, (1, 4, 1)),  # one node: plain FSDP over its ranks
    (HSDP(replicate=4), 4, 2, (4, 1, 1)),
    (ModelParallel(tensor=2, parallelize=plan), 4, 4, (1, 2, 2)),
    (ModelParallel(tensor=2, parallelize=plan, data_replicate=2), 8, 4, (2, 2, 2)),
    (ModelParallel(tensor=4, parallelize=plan), 4, 4, (1, 1, 4)),
])
def test_layouts_come_from_the_degrees_and_the_world(strategy, world, node, layout):
    assert strategy.layout(Node(world, node)) == MeshLayout(*layout)


@pytest.mark.parametrize("strategy, world, node, message", [
    (FSDP(replicate=3, shard=2), 4, 4, "replicate x shard = 3 x 2 = 6 ranks, but the world has 4 processes"),
    (FSDP(replicate=3), 4, 4, "replicate=3 does not divide the 4 data-parallel ranks of 4 processes; give replicate "
                              "x shard = 4"),
    (HSDP(shard=3), 4, 4, "shard=3 does not divide the 4 data-parallel ranks"),
    (HSDP(), 6, 4, "shard=4 does not divide the 6 data-parallel ranks"),  # nodes of unequal size
    (ModelParallel(tensor=4, parallelize=plan), 4, 2, "tensor=4 does not divide the 2 processes of a node"),
    (ModelParallel(tensor=3, parallelize=plan), 4, 4, "tensor=3 does not divide the 4 processes of a node"),
    (ModelParallel(tensor=2, parallelize=plan, data_shard=3), 4, 4, "shard=3 does not divide the 2 data-parallel "
                                                                     "ranks of 4 processes (the world over tensor=2)"),
    (ModelParallel(tensor=2, parallelize=plan, data_replicate=2, data_shard=2), 4, 4,
     "replicate x shard x tensor = 2 x 2 x 2 = 8 ranks, but the world has 4 processes"),
])
def test_degrees_that_do_not_make_the_world_are_refused_with_both_numbers(strategy, world, node, message):
    with pytest.raises(ValueError) as error:
        strategy.layout(Node(world, node))
    assert message in str(error.value)


def test_hsdp_without_the_processes_per_node_asks_for_the_layout():
    with pytest.raises(ValueError, match=r"strategy=HSDP\(\): the launcher of these 4 processes does not say how many run "
                                         r"on each node, which the default layout shards over; give the layout, "
                                         r"HSDP\(shard=<processes per node>\)"):
        HSDP().layout(Node(4, None))
    assert HSDP(shard=2).layout(Node(4, None)) == MeshLayout(2, 2, 1)
    assert ModelParallel(tensor=2, parallelize=plan).layout(Node(4, None)) == MeshLayout(1, 2, 2)


def test_tensor_degree_must_divide_the_world():
    with pytest.raises(ValueError, match="tensor=4 does not divide the world of 6 processes"):
        complete("ModelParallel(tensor=4)", 6, None, None, 1, tensor=4)


def test_a_one_process_run_refuses_a_mesh_of_several_before_training(tmp_path):
    model = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match=r"strategy=FSDP\(replicate=2, shard=2\): replicate x shard = 2 x 2 = 4 ranks, "
                                         r"but the world has 1 processes"):
        tiny_run(model, strategy=FSDP(replicate=2, shard=2), logdir=tmp_path)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"tensor": 0, "parallelize": plan}, ValueError, r"ModelParallel\(tensor=...\) must be an integer >= 1, got 0"),
    ({"tensor": 2, "parallelize": "plan"}, TypeError, r"parallelize=...\) must be a function fn\(model, tensor_mesh\)"),
    ({"tensor": 2, "parallelize": plan, "plan": {"q": "colwise"}}, TypeError, r"parallelize=fn or plan=\{\.\.\.\}, not both"),
    ({"tensor": 2, "plan": {"q": "cowlise"}}, ValueError, r"plan\['q'\] = 'cowlise' is not a style"),
    ({"tensor": 2, "parallelize": plan, "replicate": 2}, TypeError, "data_replicate=..., not replicate="),
    ({"tensor": 2, "parallelize": plan, "data_shard": 1.5}, ValueError, r"shard=...\) must be an integer >= 1"),
])
def test_model_parallel_arguments_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        ModelParallel(**kwargs)


def test_fsdp_degrees_are_checked():
    with pytest.raises(ValueError, match=r"FSDP\(replicate=...\) must be an integer >= 1 or None, got 0"):
        FSDP(replicate=0)
    with pytest.raises(ValueError, match=r"HSDP\(shard=...\) must be an integer >= 1 or None, got True"):
        HSDP(shard=True)


def test_hsdp_is_named():
    assert type(resolve_strategy("hsdp")) is HSDP
    assert repr(FSDP(replicate=2, shard=2)).endswith("replicate=2, shard=2)")
    with pytest.raises(ValueError, match="'ddp', 'fsdp', 'hsdp' or 'deepspeed'"):
        resolve_strategy("tp")


def test_the_engine_takes_its_data_parallel_place():
    engine = Engine(device="cpu", rank=3, world_size=4)
    assert (engine.dp_rank, engine.dp_size, engine.tp_rank, engine.counts_samples) == (3, 4, 0, True)
    engine = Engine(device="cpu", rank=3, world_size=4, layout=MeshLayout(shard=2, tensor=2))
    assert (engine.dp_rank, engine.dp_size, engine.tp_rank, engine.tp_size) == (1, 2, 1, 2)
    assert not engine.counts_samples
    with pytest.raises(ValueError, match="a mesh of 3 data-parallel x 2 tensor-parallel ranks does not make a world"):
        Engine(device="cpu", rank=3, world_size=4, layout=MeshLayout(shard=3, tensor=2))


def test_loaders_are_split_by_the_data_parallel_coordinate():
    data = TensorDataset(torch.arange(16.0))
    loader = DataLoader(data, batch_size=2, shuffle=True)
    seen = {}
    for rank in range(4):
        engine = Engine(device="cpu", rank=rank, world_size=4, layout=MeshLayout(shard=2, tensor=2))
        split = distribute_loader(loader, engine, is_train=True, seed=3)
        assert isinstance(split.sampler, DistributedSampler) and split.sampler.num_replicas == 2
        seen[rank] = [batch[0].tolist() for batch in split]
    assert seen[0] == seen[1] and seen[2] == seen[3]  # a tensor-parallel group reads the same batches
    assert sorted(x for batch in seen[0] + seen[2] for x in batch) == list(range(16))
    engine = Engine(device="cpu", rank=1, world_size=2, layout=MeshLayout(tensor=2))
    assert distribute_loader(loader, engine, is_train=True) is loader  # one data-parallel rank reads all


def test_the_total_norm_of_plain_gradients_is_torch_s():
    grads = [torch.randn(3, 4), torch.randn(5)]
    torch.testing.assert_close(total_norm(grads), torch.nn.utils.get_total_norm(grads))
