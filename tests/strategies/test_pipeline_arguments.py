"""Pipeline arguments refused when given, naming the argument, what was given and what is expected; layouts and
splits of a model into stages (in process, no world needed)."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import ModelParallel, Pipeline, SupervisedRunner
from torchstage.distributed.layout import MeshLayout
from torchstage.launch.world import World
from torchstage.strategies.pipeline_schedule import local_stages, schedule_class
from torchstage.strategies.pipeline_split import Part, pieces, split


class Net(nn.Module):
    def __init__(self, blocks=4):
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(blocks))
        self.head = nn.Linear(4, 1)


@pytest.mark.parametrize("make, message", [
    (lambda: Pipeline(0), "Pipeline(pipeline=...) must be an integer >= 1"),
    (lambda: Pipeline(1), "Pipeline(pipeline=1): a pipeline has at least 2 stages' ranks; without one use "
                          "strategy='fsdp' or 'ddp'"),
    (lambda: Pipeline(2, schedule="OneFOneB"), "Pipeline(schedule=...) must name one of torch's pipeline schedules, "
                                               "GPipe, 1F1B, Interleaved1F1B"),
    (lambda: Pipeline(2, schedule="PipelineScheduleSingle"), "must name one of torch's pipeline schedules"),
    (lambda: Pipeline(2, stages_per_rank=2), "Pipeline(stages_per_rank=2) does not fit schedule='1F1B', which runs 1 "
                                             "stage per rank"),
    (lambda: Pipeline(2, schedule="ZBVZeroBubble"), "Pipeline(schedule='ZBVZeroBubble'): torch's V-shaped schedules "
                                                    "cannot run forward only"),
    (lambda: Pipeline(2, n_microbatches=0), "Pipeline(n_microbatches=...) must be an integer >= 1, got 0"),
    (lambda: Pipeline(2, split="blocks.2"), "Pipeline(split=...) must be a list of the 1 piece names"),
    (lambda: ModelParallel(pipeline=2, tensor=2, parallelize=3), "ModelParallel(parallelize=...) must be a function"),
])
def test_bad_pipeline_arguments_are_refused_when_given(make, message):
    with pytest.raises((ValueError, TypeError)) as error:
        make()
    assert message in str(error.value)


@pytest.mark.parametrize("make, world, layout", [  # made in the test: torch's schedules load (1.2 s) when it runs
    (lambda: Pipeline(2), 4, MeshLayout(shard=2, pipeline=2)),
    (lambda: Pipeline(4), 4, MeshLayout(pipeline=4)),
    (lambda: ModelParallel(pipeline=2, data_replicate=2), 8, MeshLayout(replicate=2, shard=2, pipeline=2)),
    (lambda: ModelParallel(tensor=2, parallelize=lambda m, mesh: m, pipeline=2), 4, MeshLayout(tensor=2, pipeline=2)),
])
def test_the_pipeline_is_a_dimension_of_the_layout(make, world, layout):
    assert make().layout(World(rank=0, world_size=world, local_size=world)) == layout


def test_a_pipeline_that_does_not_divide_the_world_is_refused_before_it_starts():
    with pytest.raises(ValueError, match=r"strategy=Pipeline\(pipeline=3\): pipeline=3 does not divide the "
                                         r"world of 4 processes"):
        Pipeline(3).layout(World(rank=0, world_size=4, local_size=4))


def test_a_model_splits_into_even_runs_of_its_pieces_under_their_names():
    model = Net()
    assert [name for name, _ in pieces(model)] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    stages = split(model, 4)
    assert [[name for name, _ in stage] for stage in stages] == [["embed", "blocks.0"], ["blocks.1", "blocks.2"],
                                                                 ["blocks.3"], ["head"]]
    part = Part(stages[1] + stages[3])  # a looped rank's stages 1 and 3: the model's own parameter names
    assert sorted(part.state_dict()) == ["blocks.1.bias", "blocks.1.weight", "blocks.2.bias", "blocks.2.weight",
                                         "head.bias", "head.weight"]
    assert part.blocks["2"].weight is model.blocks[2].weight  # the model's own modules, not copies


def test_a_split_by_names_cuts_where_each_stage_begins():
    stages = split(Net(), 2, ["blocks.3"])
    assert [len(stage) for stage in stages] == [4, 2]
    sequential = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    assert [[n for n, _ in s] for s in split(sequential, 3)] == [["0"], ["1"], ["2"]]


@pytest.mark.parametrize("model, stages, at, message", [
    (Net(1), 4, None, "a pipeline of 4 stages needs at least 4 pieces, but Net has 3 (['embed', 'blocks.0', 'head'])"),
    (Net(), 2, ["blocks.9"], "split=... must name the 1 pieces where stages 2 to 2 begin, got ['blocks.9'] "
                             "('blocks.9' is no piece)"),
    (Net(), 3, ["blocks.2", "blocks.1"], "split=... must name pieces in their order"),
    (Net(), 2, ["embed"], "split=... must name pieces in their order"),
])
def test_a_split_that_cannot_work_is_refused_naming_the_pieces(model, stages, at, message):
    with pytest.raises(ValueError) as error:
        split(model, stages, at)
    assert message in str(error.value)


def test_a_model_holding_a_parameter_itself_is_refused():
    model = Net()
    model.scale = nn.Parameter(model.head.weight.new_ones(1))
    with pytest.raises(ValueError, match="Net holds 'scale' itself; put it in a sub-module"):
        pieces(model)


def test_stages_per_rank_follow_the_schedule_loop_or_v():
    looped, v_shaped = schedule_class("Interleaved1F1B", "P"), schedule_class("ZBVZeroBubble", "P")
    assert [local_stages(looped, rank, 2, 2) for rank in range(2)] == [[0, 2], [1, 3]]
    assert [local_stages(v_shaped, rank, 2, 2) for rank in range(2)] == [[0, 3], [1, 2]]


def test_a_dict_of_criteria_is_refused_before_any_process_starts():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
    with pytest.raises(ValueError, match=r"strategy=Pipeline\(pipeline=2, schedule='1F1B', n_microbatches=2\) computes "
                                         r"the loss inside its pipeline schedule: give one criterion, not a dict of "
                                         r"them \(\['logits'\]\)"):
        SupervisedRunner().train(model=model, criterion={"logits": nn.MSELoss()}, loaders={"train": loader},
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1), valid_loader="train",
                                 strategy=Pipeline(2), distributed=True, nprocs=2, num_epochs=1)
