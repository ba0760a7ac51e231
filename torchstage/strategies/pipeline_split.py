"""A model cut into pipeline stages: its pieces in order, each stage a run of consecutive pieces, the original
parameter names kept (so a checkpoint does not depend on the pipeline's depth).

The pieces of a model are its children in the order they were registered, an ordered container of blocks
(``nn.ModuleList``, ``nn.ModuleDict``, ``nn.Sequential``) counting each of its blocks (``blocks.3``); the model
itself may be such a container. A stage runs its pieces one after another, so the model's forward must be its
pieces applied in order (``nn.Sequential``, or embed -> blocks -> norm -> head with nothing between them: put any
other step inside a module). Each piece weighs one block, the input and output modules included.
"""
from typing import Optional, Sequence

from torch import nn

#: Containers whose children are pieces of their own.
BLOCKS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


class Part(nn.Module):
    """Some pieces of a model under their original names (``embed``, ``blocks.2``...); its forward runs them in
    order."""

    def __init__(self, pieces: Sequence):
        super().__init__()
        for name, module in pieces:
            outer, _, inner = name.partition(".")
            if not inner:
                self.add_module(name, module)
                continue
            if outer not in self._modules:
                self.add_module(outer, nn.ModuleDict())
            self._modules[outer][inner] = module
        self._order = [module for _, module in pieces]  # a plain list: not registered twice
        self.names = [name for name, _ in pieces]

    def forward(self, x):
        for module in self._order:
            x = module(x)
        return x


def pieces(model: nn.Module) -> list:
    """``[(name, module)]``: the pieces of ``model`` in order; ValueError for parameters or buffers held by the model
    itself (no stage would run them)."""
    own = [name for name, _ in model.named_parameters(recurse=False)] + \
        [name for name, _ in model.named_buffers(recurse=False)]
    if own:
        raise ValueError(f"a pipeline splits a model by its sub-modules, but {type(model).__name__} holds "
                         f"{own[0]!r} itself; put it in a sub-module")
    if isinstance(model, BLOCKS):
        return list(model.named_children())
    found = []
    for name, child in model.named_children():
        if isinstance(child, BLOCKS):
            found += [(f"{name}.{key}", block) for key, block in child.named_children()]
        else:
            found.append((name, child))
    return found


def split(model: nn.Module, n_stages: int, at: Optional[Sequence[str]] = None) -> list:
    """The pieces of each of ``n_stages`` stages, in order: cut before each name of ``at`` (``n_stages - 1`` piece
    names, in order), or into runs of blocks as even as can be; ValueError, before training, naming what does not
    fit."""
    found = pieces(model)
    names = [name for name, _ in found]
    if len(found) < n_stages:
        raise ValueError(f"a pipeline of {n_stages} stages needs at least {n_stages} pieces, but "
                         f"{type(model).__name__} has {len(found)} ({names}); give fewer stages or a model with "
                         f"more blocks")
    if at is None:
        size, extra = divmod(len(found), n_stages)
        bounds, start = [], 0
        for stage in range(n_stages):
            bounds.append(start)
            start += size + (stage < extra)
    else:
        at = list(at)
        unknown = [name for name in at if name not in names]
        if len(at) != n_stages - 1 or unknown:
            raise ValueError(f"split=... must name the {n_stages - 1} pieces where stages 2 to {n_stages} begin, "
                             f"got {at!r}{f' ({unknown[0]!r} is no piece)' if unknown else ''}; the pieces are "
                             f"{names}")
        bounds = [0] + [names.index(name) for name in at]
        if bounds != sorted(set(bounds)) or bounds[1] == 0:
            raise ValueError(f"split=... must name pieces in their order, each stage at least one: got {at!r}, the "
                             f"pieces are {names}")
    ends = bounds[1:] + [len(found)]
    return [found[start:end] for start, end in zip(bounds, ends)]


def rank_part(stages: list, local: Sequence[int]) -> Part:
    """The pieces of the stages ``local`` (indices) under their names: what this rank trains and checkpoints."""
    return Part([piece for index in local for piece in stages[index]])


def stage_parts(stages: list, local: Sequence[int]) -> list:
    """A :class:`Part` for each stage of ``local``, sharing the pieces of :func:`rank_part`."""
    return [Part(stages[index]) for index in local]


def parameter_names(module: nn.Module) -> dict:
    """id(parameter) -> name, for mapping an optimizer's parameters to a part's."""
    return {id(p): name for name, p in module.named_parameters()}
