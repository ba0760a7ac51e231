"""A shuffled two-process run for the graceful-stop and elastic-restart tests; started by torch.distributed.run.

Usage: python -m torch.distributed.run --nproc-per-node=2 ddp_run.py LOGDIR [resume]
Environment: SIGNAL_AT_BATCH=n and SIGNAL_RANK=r send SIGTERM to rank r after global train batch n;
KILL_AT_BATCH=n and KILL_RANK=r SIGKILL rank r there, in the first attempt of an elastic run only.
STOP_CHECK_EVERY=k: the ranks agree on a stop every k train batches (default: about every 0.5 s, see StopCallback).
"""
import importlib.util
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

from torchstage import Batch, Callback, Engine, StopCallback, SupervisedRunner

HAS_LAUNCHER = importlib.util.find_spec("torchstage.launch.enter") is not None


class Chaos(Callback):
    order = 500

    def __init__(self, rank):
        env = os.environ
        first_attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        self.signal_at = int(env.get("SIGNAL_AT_BATCH", 0)) if int(env.get("SIGNAL_RANK", -1)) == rank else 0
        self.kill_at = int(env.get("KILL_AT_BATCH", 0)) if int(env.get("KILL_RANK", -1)) == rank and \
            first_attempt else 0

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if runner.is_train_loader and runner.global_batch_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def init_process_group(rank, world):
    """gloo over the torchrun store, with keys per restart attempt: torch 2.13's agent store keeps the
    previous attempt's gloo addresses, and a restarted rank would otherwise dial a dead process."""
    from datetime import timedelta
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return dist.init_process_group("gloo")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(seconds=120))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt_{attempt}", store), rank=rank,
                            world_size=world)


def main(logdir, resume=None):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(52, 6, generator=g), torch.randn(52, 1, generator=g)
    if HAS_LAUNCHER:  # train() resolves the world from the torchrun variables itself
        runner = SupervisedRunner()
    else:
        init_process_group(rank, world)
        model = nn.parallel.DistributedDataParallel(model)
        runner = SupervisedRunner(engine=Engine(device="cpu", rank=rank, world_size=world))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    callbacks = {"chaos": Chaos(rank)}
    if os.environ.get("STOP_CHECK_EVERY"):
        callbacks["stop"] = StopCallback(check_every=int(os.environ["STOP_CHECK_EVERY"]))
    try:
        runner.train(model=model, criterion=nn.MSELoss(), optimizer=optimizer,
                     datasets={"batch_size": 4, "train": TensorDataset(x[:40], y[:40]),
                               "valid": TensorDataset(x[40:], y[40:])},
                     callbacks=callbacks, logdir=logdir, resume=resume, num_epochs=3, seed=5,
                     checkpoint_period=(Batch(2), 1))
    finally:
        if not HAS_LAUNCHER and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
