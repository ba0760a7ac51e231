"""Under torchrun, 2 gloo ranks train a small DDP model for 20 steps; rank 1 sleeps SLEEP_MS before each forward.
Each rank writes OUT/wait-rank<r>.json: its BackwardWait per step (ms), the gradients of its last step with the hooks
and without them (from the same state), and the hooks left on the model and its parameters after remove().

Usage: torchrun --nproc-per-node=2 backward_wait.py OUT
"""
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchstage.callbacks.monitoring.step_clock import BackwardWait

SLEEP_MS = 50


def step(ddp, x):
    ddp.zero_grad(set_to_none=True)
    ddp(x).pow(2).mean().backward()
    return [p.grad.clone() for p in ddp.parameters()]


if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
    plain = step(ddp, x)
    wait = BackwardWait([ddp])
    waits = []
    for _ in range(20):
        if rank == 1:
            time.sleep(SLEEP_MS / 1e3)
        hooked = step(ddp, x)
        waits.append(wait.take() * 1e3)
    wait.remove()
    left = len(ddp._forward_hooks) + sum(len(p._backward_hooks or {}) for p in model.parameters())
    with open(os.path.join(sys.argv[1], f"wait-rank{rank}.json"), "w") as f:
        json.dump({"waits": waits, "same_grads": all(torch.equal(a, b) for a, b in zip(plain, hooked)),
                   "hooks_left": left}, f)
    del ddp  # a DDP module that outlives its process group can abort the interpreter's exit
    # Left to the collection at the interpreter's exit, the gloo group outlives destroy_process_group(), and a worker
    # thread of it still releasing the last all-reduce (its Python state needs the GIL) aborts the process
    # ("terminate called without an active exception", pytorch#190489): 4 runs in 12 here. Collected now, none in 15.
    gc.collect()
    dist.destroy_process_group()
