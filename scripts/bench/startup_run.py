"""The program scripts/bench/startup.py times: the Catalyst tutorial's regression, stopped after its first step.

Usage (the harness sets BENCH_OUT, a file prefix, and BENCH_T0, the time it started the command):
  python startup_run.py torchstage      train(distributed=True): TORCHSTAGE_NPROC ranks (one process without it)
  python startup_run.py hand            a hand-written DDP loop under torchrun (RANK set), else one process
  python startup_run.py spawn N         the same loop in N processes of torch.multiprocessing.spawn
Rank 0 writes BENCH_OUT.first (seconds from BENCH_T0 to the end of its first optimizer step); every rank writes
BENCH_OUT.cpu.<pid> (its CPU seconds at the program's first line and at the first step). With BENCH_KILL=1, rank 1
kills itself (SIGKILL) at its first step on the first attempt (BENCH_OUT.killed: when), and rank 0 of the restarted
world writes BENCH_OUT.again (seconds from the kill to its first step).
"""
import resource
import sys
import time


def cpu() -> float:
    """CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


FIRST_LINE_CPU = cpu()  # a fresh interpreter's start and the entry's imports; about nothing in a forked rank

import os  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

OUT, T0 = os.environ.get("BENCH_OUT", "/tmp/startup-bench"), float(os.environ.get("BENCH_T0", time.time()))


def first_step(rank: int) -> None:
    """Called by every rank right after its first optimizer step."""
    now = time.time()
    with open(f"{OUT}.cpu.{os.getpid()}", "w") as f:
        f.write(f"{FIRST_LINE_CPU} {cpu()}")
    attempt = os.environ.get("TORCHSTAGE_RESTART_COUNT", "0")
    if os.environ.get("BENCH_KILL") and attempt == "0" and rank == 1:
        with open(f"{OUT}.killed", "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        since = T0 if attempt == "0" else float(open(f"{OUT}.killed").read())
        with open(f"{OUT}.{'first' if attempt == '0' else 'again'}", "w") as f:
            f.write(repr(now - since))


def tutorial_data():
    """The tutorial's random regression data, drawn where the program draws it."""
    X, y = torch.rand(int(1e4), 10), torch.rand(int(1e4), 1)  # module-level data, as the tutorial builds it
    return TensorDataset(X, y)


def torchstage_run() -> None:
    """The tutorial with train(distributed=True), stopped after the first step (or, with BENCH_KILL, restarted)."""
    from torchstage import Callback, CallbackOrder, CancelRun, SupervisedRunner

    class FirstStep(Callback):
        """Notes the first step and ends the run."""
        order = CallbackOrder.External  # after the optimizer's step

        def on_batch_end(self, runner):
            """After the optimizer's step: note it, then stop."""
            first_step(runner.engine.rank)
            if not os.environ.get("BENCH_KILL") or runner.engine.world_size == 1 or os.environ.get(
                    "TORCHSTAGE_RESTART_COUNT", "0") != "0":
                raise CancelRun()

    loader = DataLoader(tutorial_data(), batch_size=32, num_workers=1)
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.Adam(model.parameters())
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
                             scheduler=torch.optim.lr_scheduler.MultiStepLR(optimizer, [3, 6]),
                             loaders={"train": loader, "valid": loader}, num_epochs=8, callbacks=[FirstStep()],
                             logdir=f"{OUT}.logdir", overwrite=os.environ.get("TORCHSTAGE_RESTART_COUNT", "0") == "0",
                             verbose=False, distributed=True,
                             max_restarts=1 if os.environ.get("BENCH_KILL") else 0)


def hand_rank(rank: int, size: int) -> None:
    """The loop a user writes by hand: a gloo group, DDP, a distributed sampler, the tutorial's loader."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    data, sampler = tutorial_data(), None
    model = torch.nn.Linear(10, 1)
    if size > 1:
        dist.init_process_group("gloo", rank=rank, world_size=size)
        model, sampler = DistributedDataParallel(model), DistributedSampler(data)
    optimizer = torch.optim.Adam(model.parameters())
    for x, y in DataLoader(data, batch_size=32, num_workers=1, sampler=sampler):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        first_step(rank)
        break
    if size > 1:
        del model
        dist.destroy_process_group()


def spawned_rank(rank: int, size: int, port: int) -> None:
    """A rank of torch.multiprocessing.spawn: the rendezvous address, then the hand-written loop."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    hand_rank(rank, size)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "torchstage":
        torchstage_run()
    elif mode == "hand":
        hand_rank(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
    else:
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            free = sock.getsockname()[1]
        mp.spawn(spawned_rank, args=(int(sys.argv[2]), free), nprocs=int(sys.argv[2]))
