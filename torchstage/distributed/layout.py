"""The layout arithmetic of a run's processes: how many ranks each dimension of the device mesh has, and from a rank
its coordinates, its data-parallel place (which batches it trains) and whether it counts its samples.

A :class:`MeshLayout` has one field per dimension, outermost first. Ranks are laid out row-major in that order, the
last field innermost, as torch's ``init_device_mesh`` numbers them: with (replicate, shard, tensor),
rank = (r x shard + s) x tensor + t. A dimension is either a *data* dimension (its ranks train different batches:
``replicate``, ``shard``) or a *model* dimension (its ranks split one model and train the same batch: ``tensor``;
pipeline stages and context parallelism would be others). The data-parallel rank is the coordinate over the data
dimensions alone, so ranks that differ only in model coordinates read the same batches; of those, the first (every
model coordinate 0) counts the samples in metrics. Adding a dimension is one field here, e.g.
``context: int = dim(data=False)`` between ``shard`` and ``tensor``; everything below follows from the fields.

``pipeline`` (the stages of a pipeline schedule) is the outermost dimension, across nodes by default, although declared
last (so a layout is still spelled ``MeshLayout(replicate, shard, tensor)``). Its ranks hold different layers, so the
samples are counted where the outputs are: on its *last* stage. A pipeline of one stage is no dimension at all:
:meth:`MeshLayout.as_dict` and ``str`` leave it out, so layouts and checkpoints without a pipeline read as before.
"""
import math
import numbers
from dataclasses import dataclass, field, fields


def dim(*, data: bool, outer: bool = False, counted_last: bool = False):
    """A mesh dimension (one rank unless given); ``data``: its ranks train different batches; ``outer``: laid out
    outside the others whatever its place among the fields; ``counted_last``: its last coordinate counts the samples
    (a model dimension whose last rank computes the outputs), else its first."""
    return field(default=1, metadata={"data": data, "outer": outer, "counted_last": counted_last})


@dataclass(frozen=True)
class MeshLayout:
    """How many ranks replicate the model (``replicate``), shard it (``shard``) and split its layers (``tensor``);
    their product is the world size."""

    replicate: int = dim(data=True)
    shard: int = dim(data=True)
    tensor: int = dim(data=False)
    pipeline: int = dim(data=False, outer=True, counted_last=True)

    def __post_init__(self):
        for name in self.names():
            check_degree("MeshLayout", name, getattr(self, name), allow_none=False)

    @classmethod
    def names(cls) -> tuple:
        """The dimensions, outermost first (``outer`` ones before the others, each in the order of the fields)."""
        ordered = sorted(fields(cls), key=lambda f: not f.metadata.get("outer", False))
        return tuple(f.name for f in ordered)

    @classmethod
    def data_names(cls) -> tuple:
        """The dimensions whose ranks train different batches."""
        return tuple(name for name in cls.names() if cls._meta(name)["data"])

    @classmethod
    def _meta(cls, name: str) -> dict:
        return next(f.metadata for f in fields(cls) if f.name == name)

    @property
    def shape(self) -> tuple:
        return tuple(getattr(self, name) for name in self.names())

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dp_size(self) -> int:
        """Ranks that train different batches: the product of the data dimensions."""
        return math.prod(getattr(self, name) for name in self.data_names())

    def model_dims(self) -> dict:
        """Name -> ranks of each model dimension (those that train one batch together)."""
        return {name: n for name, n in self.as_dict().items() if name not in self.data_names()}

    def coordinates(self, rank: int) -> dict:
        """Name -> ``rank``'s coordinate along each dimension (row-major, the last innermost)."""
        coords = {}
        for name in reversed(self.names()):
            rank, coords[name] = divmod(rank, getattr(self, name))
        return {name: coords[name] for name in self.names()}

    def data_rank(self, rank: int) -> int:
        """``rank``'s data-parallel rank: its coordinate over the data dimensions, row-major."""
        coords, index = self.coordinates(rank), 0
        for name in self.data_names():
            index = index * getattr(self, name) + coords[name]
        return index

    def counts_samples(self, rank: int) -> bool:
        """Whether ``rank`` counts the samples its model-parallel group trains: every model coordinate at its
        counting place (the first, or the last for a pipeline), so each sample counts once."""
        coords = self.coordinates(rank)
        return all(coords[name] == (getattr(self, name) - 1 if self._meta(name)["counted_last"] else 0)
                   for name in self.model_dims())

    def __str__(self) -> str:
        return " x ".join(f"{name} {n}" for name, n in self.as_dict().items())

    def as_dict(self) -> dict:
        """Name -> ranks, outermost first; an ``outer`` dimension of one rank (no pipeline) is left out."""
        return {name: getattr(self, name) for name in self.names()
                if getattr(self, name) > 1 or not self._meta(name)["outer"]}


def check_degree(owner: str, name: str, value, allow_none: bool = True):
    """``value`` as a mesh degree (an integer >= 1, or None where ``allow_none``); ValueError naming
    ``owner(name=...)`` otherwise."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{owner}({name}=...) must be an integer >= 1{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    return int(value)


def node_size(world):
    """The processes on ``world``'s node: 1 for a single process, None where its launcher does not say."""
    return world.local_size if world.world_size > 1 else 1


def complete(owner: str, world: int, replicate, shard, default_shard: int, **model: int) -> MeshLayout:
    """The layout of ``world`` ranks with the model dimensions ``model`` (``tensor=2``...) and the data-parallel
    degrees given (None: derived; both None: ``default_shard`` ranks shard, the rest replicate); ValueError, before
    training, naming the numbers when they do not make the world."""
    split = {name: degree for name, degree in model.items() if degree > 1}
    inner = math.prod(split.values())
    if world % inner:
        given = " x ".join(f"{name}={degree}" for name, degree in split.items())
        advice = f"a {next(iter(split))} degree that divides it" if len(split) == 1 else \
            "degrees whose product divides it"
        raise ValueError(f"{owner}: {given} does not divide the world of {world} processes; give {advice}")
    data = world // inner
    over = f" (the world over {' x '.join(f'{k}={v}' for k, v in split.items())})" if split else ""
    if replicate is None and shard is None:
        shard = default_shard
    if shard is None:
        if data % replicate:
            raise ValueError(f"{owner}: replicate={replicate} does not divide the {data} data-parallel ranks of "
                             f"{world} processes{over}; give replicate x shard = {data}")
        shard = data // replicate
    if replicate is None:
        if data % shard:
            raise ValueError(f"{owner}: shard={shard} does not divide the {data} data-parallel ranks of {world} "
                             f"processes{over}; give replicate x shard = {data}")
        replicate = data // shard
    layout = MeshLayout(replicate=replicate, shard=shard, **model)
    if layout.size != world:
        names = " x ".join(["replicate", "shard", *split])
        degrees = " x ".join(str(d) for d in (replicate, shard, *split.values()))
        raise ValueError(f"{owner}: {names} = {degrees} = {layout.size} ranks, but the world has {world} processes; "
                         f"the product must equal the world size")
    return layout
