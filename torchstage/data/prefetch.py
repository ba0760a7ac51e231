"""Overlapping host-to-device copies with compute: the next batch moves on a side CUDA stream."""
import torch

from torchstage.distributed.engine import Engine


def prefetch_to_device(batches, engine: Engine):
    """Yield ``(step, batch)`` from ``batches`` one ahead, the next batch already copied to the GPU.

    The copy of batch ``n+1`` runs on a side stream while batch ``n`` trains; the main stream waits for
    it before use. Off CUDA this is the plain iterator. Use pinned host memory (``pin_memory=True``)
    so the copies are truly asynchronous.
    """
    if engine.device.type != "cuda":
        yield from batches
        return
    stream = torch.cuda.Stream(engine.device)

    def copy(item):
        if item is None:
            return None
        with torch.cuda.stream(stream):
            return item[0], engine.to_device(item[1])

    iterator = iter(batches)
    upcoming = copy(next(iterator, None))
    while upcoming is not None:
        current = torch.cuda.current_stream(engine.device)
        current.wait_stream(stream)
        _record_stream(upcoming[1], current)
        ready, upcoming = upcoming, copy(next(iterator, None))
        yield ready


def _record_stream(obj, stream) -> None:
    """Tell the caching allocator that tensors made on the side stream are used on ``stream``."""
    if isinstance(obj, torch.Tensor):
        obj.record_stream(stream)
    elif isinstance(obj, dict):
        for value in obj.values():
            _record_stream(value, stream)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _record_stream(value, stream)
