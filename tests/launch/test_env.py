"""resolve_world: precedence, process counts, and errors that name the setting."""
import pytest

from torchstage.launch.resolve import World, resolve_world

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}


def test_laptop_is_a_single_process():
    world = resolve_world(environ={}, gpus=0)
    assert (world.rank, world.world_size, world.spawn, world.source, world.backend) == (0, 1, 0, "single", "gloo")
    assert not world.is_distributed


def test_cpu_process_count_from_env_or_argument():
    world = resolve_world(environ={"TORCHSTAGE_NPROC": "3"}, gpus=0)
    assert (world.world_size, world.spawn, world.source, world.backend, world.master_port) == (3, 3, "local", "gloo", None)
    world = resolve_world(nprocs=2, environ={"TORCHSTAGE_NPROC": "3"}, gpus=0)
    assert (world.world_size, world.spawn, world.source) == (2, 2, "arguments")
    assert resolve_world(nprocs=1, environ={"TORCHSTAGE_NPROC": "3"}, gpus=0).spawn == 0


def test_one_process_per_visible_gpu_with_nccl():
    world = resolve_world(environ={}, gpus=4)
    assert (world.world_size, world.spawn, world.backend, world.device_type) == (4, 4, "nccl", "cuda")
    assert resolve_world(environ={}, gpus=1).spawn == 0
    assert resolve_world(nprocs=2, environ={}, gpus=4).spawn == 2


def test_torchrun_variables_beat_process_counts():
    world = resolve_world(nprocs=2, environ={**TORCHRUN, "TORCHSTAGE_NPROC": "3"}, gpus=0)
    assert world == World(rank=1, world_size=4, local_rank=1, master_addr="10.0.0.1", master_port=29400,
                          source="torchrun", spawn=0, backend="gloo")


def test_explicit_arguments_beat_torchrun():
    world = resolve_world(environ=TORCHRUN, gpus=0, rank=0, world_size=2, master_port=1234)
    assert (world.rank, world.world_size, world.source, world.master_port, world.spawn) == (0, 2, "arguments", 1234, 0)


SLURM_TASK = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2",
              "SLURM_STEP_NODELIST": "localhost,localhost", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
              "MASTER_ADDR": "127.0.0.1"}


def test_a_slurm_task_is_a_rank_below_torchrun():
    world = resolve_world(environ=SLURM_TASK, gpus=0)
    assert (world.rank, world.world_size, world.local_rank, world.spawn, world.source) == (1, 2, 0, 0, "slurm")
    assert 1024 <= world.master_port < 65536
    assert resolve_world(environ={**SLURM_TASK, **TORCHRUN}, gpus=0).source == "torchrun"


def test_one_slurm_task_per_node_spawns_a_process_per_device():
    world = resolve_world(environ={**SLURM_TASK, "TORCHSTAGE_NPROC": "3"}, gpus=0)
    assert (world.rank, world.world_size, world.spawn, world.source) == (3, 6, 3, "slurm")


@pytest.mark.parametrize("kwargs, message", [
    ({"nprocs": 0}, "nprocs must be an integer >= 1, got 0"),
    ({"nprocs": 3, "gpus": 2}, "nprocs=3 asks for 3 processes but only 2 GPU(s)"),
    ({"environ": {"TORCHSTAGE_NPROC": "two"}}, "TORCHSTAGE_NPROC must be an integer, got 'two'"),
    ({"environ": {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}}, "RANK=2 and WORLD_SIZE=2"),
    ({"environ": {"RANK": "0", "WORLD_SIZE": "2"}}, "MASTER_ADDR/MASTER_PORT are not"),
    ({"environ": {**TORCHRUN, "MASTER_PORT": "99999"}}, "MASTER_PORT must be a TCP port"),
    ({"rank": 1}, "give both rank and world_size"),
])
def test_settings_that_cannot_work_are_named(kwargs, message):
    kwargs = {"environ": {}, "gpus": 0, **kwargs}
    with pytest.raises(ValueError) as info:
        resolve_world(**kwargs)
    assert message in str(info.value)


def test_world_prints_one_field_per_line():
    text = str(resolve_world(environ=TORCHRUN, gpus=0))
    assert text.splitlines()[0].split() == ["rank", "1"]
    assert "source" in text and "torchrun" in text and "master_addr  10.0.0.1" in text


def test_launched_into_world_only_for_torchrun_or_slurm_worlds_of_several():
    from torchstage.launch.resolve import launched_into_world
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert launched_into_world(torchrun)
    assert not launched_into_world({**torchrun, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    assert not launched_into_world({})
    assert not launched_into_world({"TORCHSTAGE_NPROC": "2"})  # a local launch needs distributed=True


def test_distributed_must_be_none_or_bool():
    import pytest
    import torch
    from torchstage import SupervisedRunner
    model = torch.nn.Linear(1, 1)
    with pytest.raises(TypeError, match=r"distributed must be None .* got 'yes'"):
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), distributed="yes",
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 loaders={"train": [(torch.zeros(1, 1), torch.zeros(1, 1))], "valid": [1]})
