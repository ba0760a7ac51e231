"""Syncing a torchmetrics metric's states through a torchstage engine: exact on unpadded shards, never hangs.

torchmetrics' own sync (``gather_all_tensors``) is switched off: it pads by shape and fails or hangs when a
rank saw no data (its empty list state has another number of dimensions). Here every rank joins the same
collectives whatever it saw: list states are concatenated locally, their trailing shape and dtype agreed
first, then gathered with their true lengths, so each sample counts exactly once.
"""
import torch

from torchstage.distributed.engine import Engine


def state_names(metric) -> list:
    """The metric's registered state names, in a fixed order (the same on every rank)."""
    return sorted(metric._defaults)


def sync_metric_states(metric, engine: Engine) -> None:
    """Replace ``metric``'s local states by the global ones (same reductions as torchmetrics); collective."""
    if not engine.is_distributed:
        return
    names = state_names(metric)
    lists = [n for n in names if isinstance(getattr(metric, n), list)]
    local = {n: _cat(getattr(metric, n)) for n in lists}
    shapes = engine.all_gather_object({n: None if t is None else (tuple(t.shape[1:]), str(t.dtype))
                                       for n, t in local.items()})
    for name in names:
        reduce = metric._reductions[name]
        if name in local:
            known = [s[name] for s in shapes if s[name] is not None]
            if not known:  # no rank saw data for this state
                setattr(metric, name, [])
                continue
            trailing, dtype = known[0]
            tensor = local[name]
            if tensor is None:
                tensor = torch.empty((0, *trailing), dtype=getattr(torch, dtype.split(".")[1]), device=engine.device)
            gathered = _gather_cat(engine, tensor)
            setattr(metric, name, [gathered])
            continue
        state = getattr(metric, name)
        stacked = _gather_cat(engine, state.unsqueeze(0))  # one row per rank that counts its samples
        setattr(metric, name, reduce(stacked) if reduce is not None else stacked)
    counts = torch.tensor([metric._update_count], dtype=torch.float64, device=engine.device)
    metric._update_count = int(engine.all_reduce_samples_(counts).item())  # once per loader, not per batch


def _cat(items: list):
    """One tensor of a list state (dim 0 concatenated; 0-dim items become rows), or None if empty."""
    if not items:
        return None
    return torch.cat([t.reshape(1) if t.dim() == 0 else t for t in items])


def _gather_cat(engine, tensor: torch.Tensor) -> torch.Tensor:
    """All ranks' ``tensor`` concatenated along dim 0 in rank order (lengths may differ), each sample once (the
    ranks of a tensor-parallel group but its first give no rows)."""
    device = tensor.device
    moved = tensor.to(engine.device)
    if moved.dtype == torch.bool:  # gloo has no bool collectives
        return engine.all_gather_samples(moved.to(torch.uint8)).bool().to(device)
    return engine.all_gather_samples(moved).to(device)
