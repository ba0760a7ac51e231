"""The layout arithmetic and the engine's place in the mesh, in process: the data-parallel rank is the coordinate over
the data dimensions, ranks that differ only in a model dimension read the same batches and only the first counts
its samples, for any dimensions a layout has (a context dimension added as one field); the engine is immutable."""
import dataclasses

import pytest

from torchstage import Engine
from torchstage.distributed.layout import MeshLayout, complete, dim


@dataclasses.dataclass(frozen=True)
class WithContext(MeshLayout):
    """A layout with one more model dimension, as context parallelism would add it (here innermost)."""

    context: int = dim(data=False)


def test_coordinates_are_row_major_in_the_order_of_the_fields():
    layout = MeshLayout(replicate=2, shard=2, tensor=2)
    # the pipeline dimension is outermost, though declared last; of one stage it is no dimension in its dict
    assert layout.names() == ("pipeline", "replicate", "shard", "tensor") and layout.shape == (1, 2, 2, 2)
    assert layout.coordinates(5) == {"pipeline": 0, "replicate": 1, "shard": 0, "tensor": 1}
    assert layout.as_dict() == {"replicate": 2, "shard": 2, "tensor": 2}
    assert [layout.data_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert (layout.size, layout.dp_size, layout.model_dims()) == (8, 4, {"tensor": 2})
    assert str(layout) == "replicate 2 x shard 2 x tensor 2"


def test_a_dimension_added_as_one_field_splits_data_and_counts_samples_like_the_others():
    layout = WithContext(shard=2, tensor=2, context=2)
    assert layout.names() == ("pipeline", "replicate", "shard", "tensor", "context") and layout.dp_size == 2
    engines = [Engine(device="cpu", rank=rank, world_size=8, layout=layout) for rank in range(8)]
    assert [e.dp_rank for e in engines] == [0, 0, 0, 0, 1, 1, 1, 1]  # tensor x context ranks read the same batches
    assert [e.counts_samples for e in engines] == [True, False, False, False] * 2
    assert [e.model_parallel_size for e in engines] == [4] * 8
    with pytest.raises(ValueError, match="a mesh of 2 data-parallel x 2 tensor-parallel x 2 context-parallel ranks "
                                         "does not make a world of 4"):
        Engine(device="cpu", rank=0, world_size=4, layout=layout)


def test_complete_derives_the_data_degrees_around_several_model_dimensions():
    assert complete("X", 8, None, None, 2, tensor=2) == MeshLayout(replicate=2, shard=2, tensor=2)
    with pytest.raises(ValueError, match="X: context=3 x tensor=2 does not divide the world of 8 processes; give "
                                         "degrees whose product divides it"):
        complete("X", 8, None, None, 1, context=3, tensor=2)


def test_the_engine_is_made_once_and_never_written():
    engine = Engine(device="cpu", rank=1, world_size=2)
    assert (engine.dp_rank, engine.dp_size, engine.layout) == (1, 2, MeshLayout(replicate=2))
    for field, value in (("dp_rank", 0), ("layout", MeshLayout(shard=2)), ("device", "cpu")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(engine, field, value)


def test_a_pipeline_is_outermost_reads_one_batch_and_counts_samples_on_its_last_stage():
    layout = MeshLayout(shard=2, tensor=2, pipeline=2)
    assert str(layout) == "pipeline 2 x replicate 1 x shard 2 x tensor 2"
    assert [layout.coordinates(rank)["pipeline"] for rank in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    engines = [Engine(device="cpu", rank=rank, world_size=8, layout=layout) for rank in range(8)]
    assert [e.dp_rank for e in engines] == [0, 0, 1, 1, 0, 0, 1, 1]  # the stages of one pipeline: the same batches
    assert [e.counts_samples for e in engines] == [False] * 4 + [True, False, True, False]  # last stage, tensor 0
    assert complete("X", 8, None, None, 2, tensor=2, pipeline=2) == layout
    with pytest.raises(ValueError, match="X: tensor=2 x pipeline=3 does not divide the world of 8 processes"):
        complete("X", 8, None, None, 1, tensor=2, pipeline=3)
