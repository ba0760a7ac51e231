"""Fresh processes per run: ``SupervisedRunner.train(distributed=True)`` vs a hand-written (DDP) loop.

Each contender is a fresh ``torchrun --standalone --nproc-per-node=2`` of this script (``--nproc 1``: a
fresh ``python`` of it, the hand-written loop without DDP), timed from the command's start to its end
(wall) and by the CPU time of all its processes (torchrun, the ranks, their DataLoader workers). Contenders run in turns (each in each position of a round equally often, as in
``overhead.py``), after a warm-up round; prints medians, ratios to the hand-written loop and paired
per-round ratios with a 95 % bootstrap interval of their median.

``--split`` adds contenders that each remove one part of torchstage's default chain (the watchdog thread,
the even-batches check, the graceful stop's per-batch agreement, the straggler detector, the non-finite loss
check, the per-epoch checkpoint, every file): the part's
price is how much faster the run gets without it.
Usage: python scripts/bench/ddp_overhead.py [--repeats 5] [--nproc 2] [--num-workers 1] [--split] [--only NAME ...]
"""
import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

#: Seconds after which a run counts as hung and its round is run again. On CPython before 3.11.10 (and 3.10.15,
#: 3.9.20) a DataLoader worker forked while a gloo thread creates a Python thread state can deadlock in the
#: child (CPython gh-112275), for the hand-written loop and torchstage alike: about 1 run in 10-20 here.
HUNG_AFTER = 120

#: torchstage contenders of ``--split``: name -> ``train()`` overrides that remove one part of the default chain.
SPLIT = {
    "no watchdog": {"hang_timeout": None},
    "no even-batches check": {"callbacks": {"even_batches": None}},
    "no stop agreement": {"callbacks": {"stop": None}},
    "no straggler detector": {"callbacks": {"stragglers": None}},
    "no non-finite check": {"callbacks": {"nonfinite": None}},
    "no checkpoint": {"callbacks": {"checkpoint": None}},
    "no logdir": {"logdir": None},
}


def hand_written_one(logdir: str, num_workers: int) -> None:
    """The single-process loop of ``overhead.py`` (``workload.hand_written``), in this fresh process."""
    import workload
    model, criterion, optimizer, scheduler = workload.make_parts()
    workload.hand_written(workload.benchmark_loaders(num_workers), workload.NUM_EPOCHS, model, criterion,
                          optimizer, scheduler, checkpoint_path=os.path.join(logdir, "hand.pth"))


def hand_written_ddp(logdir: str, num_workers: int) -> None:
    """The hand-written DDP loop on the tutorial's data (``workload.hand_written_ddp``)."""
    from torch.utils.data import TensorDataset
    import workload
    workload.hand_written_ddp(TensorDataset(*workload.make_data()), workload.NUM_EPOCHS, num_workers,
                              os.path.join(logdir, "hand.pth"))


def torchstage_run(logdir: str, num_workers: int, overrides: dict) -> None:
    """The tutorial's ``train()`` call with its default chain, ``distributed=True`` (joins torchrun's world)."""
    import workload
    from torchstage import SupervisedRunner

    loaders = workload.benchmark_loaders(num_workers)
    model, criterion, optimizer, scheduler = workload.make_parts()
    kwargs = dict(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler, loaders=loaders,
                  logdir=logdir, num_epochs=workload.NUM_EPOCHS, verbose=False, overwrite=True, distributed=True)
    kwargs.update(overrides)
    SupervisedRunner().train(**kwargs)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and the processes below it."""
    from stress_launch import process_tree
    for child in process_tree(pid):
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def child_env(pycache: str) -> dict:
    """The environment of a benchmark's child run: no inherited world, one torch thread, no GPU, this checkout on
    the path, and bytecode cached in ``pycache`` even where ``PYTHONDONTWRITEBYTECODE`` is set (as on these
    machines): an installed package has its bytecode compiled at install, and a checkout compiled afresh by
    every process costs torchstage about 0.12 s of CPU per process (150 modules) that no installed copy pays."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([ROOT, HERE]),
               PYTHONPYCACHEPREFIX=pycache)
    return env


def launch(name: str, logdir: str, num_workers: int, nproc: int, pycache: str) -> tuple:
    """One run of this script as contender ``name``: (wall seconds, CPU seconds of all its processes), or None
    when it hung (bytecode cached in ``pycache``, see :func:`child_env`)."""
    env = child_env(pycache)
    command = [os.path.abspath(__file__), "--worker", name, "--logdir", logdir, "--num-workers", str(num_workers)]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    command = [sys.executable, *launcher, *command]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=True) as proc:
        try:
            proc.wait(timeout=HUNG_AFTER)
        except subprocess.TimeoutExpired:  # see HUNG_AFTER: the round is run again
            kill_tree(proc.pid)  # torchrun and its workers, which leave its session
            proc.wait()
            return None
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def report(times: dict, cpu: dict) -> None:
    from overhead import median_interval
    base, base_cpu = statistics.median(times["hand-written"]), statistics.median(cpu["hand-written"])
    for name, values in times.items():
        med, med_cpu = statistics.median(values), statistics.median(cpu[name])
        print(f"{name:>22}: wall median {med:.3f} s (ratio {med / base:.3f})   "
              f"cpu median {med_cpu:.3f} s (ratio {med_cpu / base_cpu:.3f})   over {len(values)} runs")
    for name in [name for name in times if name != "hand-written"]:
        for label, measured in (("wall", times), ("cpu", cpu)):
            per_round = [t / h for t, h in zip(measured[name], measured["hand-written"])]
            low, high = median_interval(per_round)
            print(f"{name} / hand-written per round ({label}): {' '.join(f'{r:.3f}' for r in per_round)}; "
                  f"median {statistics.median(per_round):.3f} (95 % interval {low:.3f} to {high:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--nproc", type=int, default=2, choices=(1, 2), help="processes per run")
    parser.add_argument("--split", action="store_true", help="add contenders without one part each")
    parser.add_argument("--only", nargs="*", default=None, help="of the --split contenders, only these")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--logdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # torchrun parses "--nproc" after the script as its own option: read the world instead
        distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        if args.worker == "hand-written":
            return (hand_written_ddp if distributed else hand_written_one)(args.logdir, args.num_workers)
        overrides = {**SPLIT.get(args.worker, {}), **({} if distributed else {"distributed": False})}
        return torchstage_run(args.logdir, args.num_workers, overrides)
    from overhead import round_order  # not in the workers: the hand-written one imports no torchstage
    names = ["hand-written", "torchstage"]
    if args.split:
        names += [name for name in SPLIT if args.only is None or name in args.only]
    times, cpu = {name: [] for name in names}, {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        repeat, hung = 0, 0
        while repeat <= args.repeats:
            measured = {}
            for name in round_order(names, repeat):
                logdir = os.path.join(tmp, name.replace(" ", "_"))
                os.makedirs(logdir, exist_ok=True)
                measured[name] = launch(name, logdir, args.num_workers, args.nproc, os.path.join(tmp, "pycache"))
                if measured[name] is None:
                    break
            if None in measured.values():
                hung += 1
                print(f"round {repeat}: {name} hung (see HUNG_AFTER); the round runs again", flush=True)
                continue
            if repeat:  # the first round warms the page cache and fills the bytecode cache
                for name, (wall, seconds) in measured.items():
                    times[name].append(wall)
                    cpu[name].append(seconds)
            repeat += 1
    print(f"{hung} hung run(s) left out")
    report(times, cpu)


if __name__ == "__main__":
    main()
