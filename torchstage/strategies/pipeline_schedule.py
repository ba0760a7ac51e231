"""One pipeline step through torch's own schedules (``torch.distributed.pipelining``): the batch split into
microbatches, inputs to the first stage, targets and the criterion to the last, forward and backward together.

The loss of each microbatch is the criterion's times its share of the batch (``scale_grads=False``), so the
gradients are those of the batch's mean loss and the data-parallel average makes them the global batch's, as under
DDP. After each step the last stage gives the batch's loss (and the outputs' shape) to every stage of its pipeline:
every rank holds the same loss (loggers, the non-finite check), and the outputs where the samples are counted.
A schedule with its ``PipelineStage`` objects is made per batch shape and mode (a stage's buffers have the shapes of
its first step): the last, shorter batch of a loader and the evaluation loaders get their own.
"""
import logging

import torch

logger = logging.getLogger(__name__)

#: torch's schedules that place stages in a V (rank r holds stages r and 2P - 1 - r); the others loop (r, r + P...).
V_SHAPED = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")


def schedule_class(name: str, owner: str):
    """torch's schedule class named ``name`` ("1F1B", "Interleaved1F1B"...); ValueError naming the choices."""
    from torch.distributed.pipelining.schedules import get_schedule_class  # heavy; pipelines only
    try:
        found = get_schedule_class(name) if isinstance(name, str) else None
    except ValueError:
        found = None
    if found is not None and found.__name__ not in ("PipelineScheduleSingle", "PipelineScheduleMulti"):
        return found
        pass
    names = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]
    raise ValueError(f"{owner}(schedule=...) must name one of torch's pipeline schedules, {', '.join(names)}; got "
                     f"{name!r}")


def is_multi(cls) -> bool:
    """True for a schedule running several stages per rank (looped or V-shaped)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti
    return issubclass(cls, PipelineScheduleMulti)


def local_stages(cls, rank: int, size: int, per_rank: int) -> list:
    """The stage indices pipeline rank ``rank`` of ``size`` holds under schedule ``cls``, ``per_rank`` each."""
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping
    mapping = generate_stage_to_rank_mapping(size, size * per_rank, style="v" if cls.__name__ in V_SHAPED else "loop")
    return [stage for stage, owner in sorted(mapping.items()) if owner == rank]


class ScaledLoss:
    """The schedule's loss function: the criterion of a microbatch times its share of the batch."""

    def __init__(self):
        self.criterion, self.batch = None, 1

    def __call__(self, output, target):
        return self.criterion(output, target) * (target.shape[0] / self.batch)


class PipelineRunner:
    """The schedules of one model's pipeline on this rank: its stage modules, their indices, the pipeline's process
    group; :meth:`step` runs one batch."""

    def __init__(self, cls, parts: list, indices: list, n_stages: int, n_microbatches: int, group, device, owner):
        self.cls, self.parts, self.indices, self.n_stages = cls, parts, indices, n_stages
        self.n_microbatches, self.group, self.device, self.owner = n_microbatches, group, device, owner
        self.loss = ScaledLoss()
        self.schedules = {}
        import torch.distributed as dist
        self.size = dist.get_world_size(group)
        self.last_owner = last_stage_owner(cls, n_stages, self.size)  # the pipeline rank computing the outputs
        self.first, self.last = 0 in indices, n_stages - 1 in indices

    def build(self, n_microbatches: int, cls=None):
        """A schedule (``cls``, by default the one asked for) of ``n_microbatches`` over fresh stages of this rank's
        parts (torch validates it)."""
        cls = cls or self.cls
        from torch.distributed.pipelining import PipelineStage
        stages = [PipelineStage(part, index, self.n_stages, self.device, group=self.group)
                  for part, index in zip(self.parts, self.indices)]
        return cls(stages if is_multi(cls) else stages[0], n_microbatches=n_microbatches, loss_fn=self.loss,
                   scale_grads=False)

    def check(self, batch_size):
        """ValueError, before training, when ``n_microbatches`` does not fit the schedule or the batch."""
        n = self.n_microbatches
        if batch_size is not None and (batch_size < n or batch_size % n):
            raise ValueError(f"{self.owner}(n_microbatches={n}) must divide the batch of {batch_size} samples a "
                             f"pipeline trains per step (each microbatch of one size); give a divisor of "
                             f"{batch_size}, or another batch_size")
        try:
            self.build(n)
        except ValueError as error:
            raise ValueError(f"{self.owner}(n_microbatches={n}) does not fit schedule {self.cls.__name__} with "
                             f"{self.n_stages} stages ({error}); give a multiple of {self.size} that is at least "
                             f"{self.n_stages}") from None

    def _schedule(self, inputs, train: bool):
        key = (tuple(inputs.shape), inputs.dtype, train)
        if key not in self.schedules:
            self.schedules[key] = [self._fitting(inputs.shape[0]), None]  # the schedule, its outputs' shape
        return self.schedules[key]

    def _fitting(self, batch: int):
        """A schedule of ``n_microbatches``, or for a batch it does not divide (a loader's last) of the largest count
        that divides it and fits the schedule, else GPipe's (LoopedBFS's for several stages per rank), which take any
        count: the gradients are the same, each microbatch weighing its share of the batch."""
        from torch.distributed.pipelining import ScheduleGPipe, ScheduleLoopedBFS
        fallback = ScheduleLoopedBFS if is_multi(self.cls) else ScheduleGPipe
        for cls in (self.cls, fallback):
            for n in range(min(self.n_microbatches, batch), 0, -1):
                if batch % n == 0:
                    try:
                        return self.build(n, cls)
                    except ValueError:
                        continue
        raise ValueError(f"{self.owner}: a batch of {batch} samples cannot be split into microbatches for schedule "
                         f"{self.cls.__name__} with {self.n_stages} stages; drop the loader's last batch "
                         f"(drop_last=True) or give a batch size that n_microbatches divides")

    def step(self, inputs, targets, criterion, train: bool):
        """``(outputs, loss)`` of one batch: forward (and backward when ``train``) through the pipeline; the outputs
        on the rank holding the last stage (zeros of their shape on the others), the batch's mean loss on every
        rank."""
        import torch.distributed as dist
        entry = self._schedule(inputs, train)
        schedule = entry[0]
        self.loss.criterion, self.loss.batch = criterion, inputs.shape[0]
        losses, args = [], (inputs,) if self.first else ()
        target = targets if self.last else None
        outputs = (schedule.step if train else schedule.eval)(*args, target=target, losses=losses)
        if entry[1] is None:  # the first step of this shape: the outputs' shape and dtype, once
            sent = [(tuple(outputs.shape), outputs.dtype) if self.last else None]
            dist.broadcast_object_list(sent, group=self.group, group_src=self.last_owner)
            entry[1] = sent[0]
        shape, dtype = entry[1]
        loss = torch.stack([value.detach().float() for value in losses]).sum() if self.last else \
            torch.zeros((), device=self.device)
        dist.broadcast(loss, group=self.group, group_src=self.last_owner)  # no host read: stays a device tensor
        if not self.last:
            outputs = torch.zeros(shape, dtype=dtype, device=self.device)
        return outputs, loss


def last_stage_owner(cls, n_stages: int, size: int) -> int:
    """The pipeline rank holding the last of ``n_stages`` stages under ``cls``."""
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping
    return generate_stage_to_rank_mapping(size, n_stages, style="v" if cls.__name__ in V_SHAPED else "loop")[n_stages - 1]
