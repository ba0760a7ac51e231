"""Bytes per rank of parameters, gradients and optimizer state, and step time: DDP against DeepSpeed ZeRO 1, 2, 3.

    python scripts/bench/deepspeed_memory.py [--nprocs 2 4] [--width 1024] [--blocks 6] [--steps 8]

The model, data, optimizer and measurements of ``fsdp_memory.py`` (a residual MLP of about 50M parameters,
AdamW, fp32, trained through ``SupervisedRunner().train(distributed=True, strategy=...)`` on gloo/CPU). Right
before AdamW's first step (inside DeepSpeed's step) it counts what rank 0 holds: the model's parameters (a
ZeRO-3 parameter its own shard) and every gradient (the model's and the ZeRO partitions'); after training, the
optimizer state: AdamW's moments and, under DeepSpeed, its fp32 master copy of the rank's partition.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_memory import Measure, main, train  # noqa: E402

from torchstage import DeepSpeed  # noqa: E402


def nbytes(tensors) -> int:
    """Bytes of the tensors' own storage, each counted once (a ZeRO-3 parameter: its shard ``ds_tensor``)."""
    seen, total = set(), 0
    for t in tensors:
        t = getattr(t, "ds_tensor", t)
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


class MeasureZeRO(Measure):
    """What a rank holds under DeepSpeed, whose optimizer steps its fp32 partitions (a copy of the weights)."""

    def at_step(self, optimizer):
        own = [p for g in optimizer.param_groups for p in g["params"]]  # DeepSpeed: its fp32 partitions
        module = list(self.module.parameters())
        self.master = nbytes(own) if own and own[0] is not module[0] else 0
        return {"params": nbytes(module), "grads": nbytes(p.grad for p in module + own if p.grad is not None)}

    def optimizer_bytes(self, optimizer):
        return nbytes(v for s in optimizer.state.values() for v in s.values() if hasattr(v, "numel")) + self.master

    def total_params(self):
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.module.parameters())


def worker(args):
    """One run (inside each launched process): train a few steps, measure, write rank 0's numbers."""
    train(args, "ddp" if args.strategy == "ddp" else DeepSpeed(stage=int(args.strategy[-1])), MeasureZeRO(args.out))


if __name__ == "__main__":
    main(worker, __file__, ("ddp", "zero1", "zero2", "zero3"), __doc__,
         "bytes held by rank 0 (optimizer state: moments, and DeepSpeed's fp32 master partition)")
