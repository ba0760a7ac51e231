"""Framework overhead: SupervisedRunner.train vs a hand-written loop on the same tiny workload, same process.

Installed peers (Ignite, Accelerate, Lightning) run the same workload too. All run in turns (each one in each
position of a round equally often, see ``round_order``), after a warm-up round; prints each contender's median
wall and CPU times with their ratio to the hand-written loop, and torchstage's paired per-round ratios (robust
to load that drifts between rounds) with a 95 % bootstrap interval of their median. ``--control`` runs the
hand-written loop a second time each round (an A/A pair): its paired ratio, which should be 1, shows how far
this machine's noise moves the figures. The ratio of the lower quartiles is printed too: less moved by
bursts of load on the host, which lengthen runs and never shorten them.
Usage: python scripts/bench/overhead.py [--repeats 5] [--num-workers 1] [--threads 1] [--no-peers] [--control]
"""
import argparse
import logging
import os
import random
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
import workload  # noqa: E402

from torchstage import SupervisedRunner  # noqa: E402


#: The A/A contender of ``--control``: the hand-written loop again, whose ratio to the first should be 1.
CONTROL = "hand-written again"


def run_torchstage(loaders, logdir, **overrides):
    """The tutorial's ``train()`` call with the default chain; ``overrides``: more ``train()`` arguments."""
    model, criterion, optimizer, scheduler = workload.make_parts()
    SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                             loaders=loaders, logdir=logdir, num_epochs=workload.NUM_EPOCHS, verbose=False,
                             overwrite=True, **overrides)


def run_hand_written(loaders, logdir):
    model, criterion, optimizer, scheduler = workload.make_parts()
    workload.hand_written(loaders, workload.NUM_EPOCHS, model, criterion, optimizer, scheduler,
                          checkpoint_path=os.path.join(logdir, "hand.pth"))


def round_order(contenders: list, repeat: int) -> list:
    """The order of round ``repeat``: rotated each round and reversed every other cycle, so that each contender
    runs in each position equally often (running second or third costs about 1 % here)."""
    shift = repeat % len(contenders)
    order = contenders[shift:] + contenders[:shift]
    return order[::-1] if (repeat // len(contenders)) % 2 else order


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the DataLoader workers): steady under other load.
    Read at nanosecond (this process) and microsecond (children) resolution: ``os.times()`` counts 10 ms
    clock ticks, 0.7 % of a 1.5 s run, coarser than the differences measured here."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def lower_quartile(values: list) -> float:
    """The run a quarter of the way up: the host's bursts of load lengthen some runs and never shorten any,
    so beside the median it shows a contender's cost with less of that noise in it."""
    return statistics.quantiles(values, n=4)[0]


def median_interval(values: list, resamples: int = 2000, seed: int = 0) -> tuple:
    """95 % percentile-bootstrap interval of the median of ``values``: how far the noise leaves it open."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--no-peers", action="store_true", help="skip installed peer frameworks")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the tutorial's one)")
    parser.add_argument("--control", action="store_true",
                        help="run the hand-written loop twice a round: the A/A ratio is the noise floor")
    args = parser.parse_args()
    loaders = workload.benchmark_loaders(args.num_workers, args.threads)
    contenders = {"hand-written": run_hand_written, "torchstage": run_torchstage}
    if args.control:
        contenders[CONTROL] = run_hand_written
    if not args.no_peers:
        contenders.update(peers.available())
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    times = {name: [] for name in contenders}
    cpu = {name: [] for name in contenders}
    with tempfile.TemporaryDirectory() as logdir:
        for repeat in range(args.repeats + 1):
            for name, fn in round_order(list(contenders.items()), repeat):
                start, start_cpu = time.perf_counter(), cpu_seconds()
                fn(loaders, logdir)
                if repeat:  # the first round warms up imports, workers and allocators
                    times[name].append(time.perf_counter() - start)
                    cpu[name].append(cpu_seconds() - start_cpu)
    base, base_cpu = statistics.median(times["hand-written"]), statistics.median(cpu["hand-written"])
    low, low_cpu = lower_quartile(times["hand-written"]), lower_quartile(cpu["hand-written"])
    for name, values in times.items():
        med, med_cpu = statistics.median(values), statistics.median(cpu[name])
        print(f"{name:>18}: wall median {med:.3f} s (ratio {med / base:.3f})   "
              f"cpu median {med_cpu:.3f} s (ratio {med_cpu / base_cpu:.3f})   over {len(values)} runs; "
              f"lower quartiles' ratios {lower_quartile(values) / low:.3f} wall, "
              f"{lower_quartile(cpu[name]) / low_cpu:.3f} cpu")
    for name in [name for name in ("torchstage", CONTROL) if name in times]:
        for label, measured in (("wall", times), ("cpu", cpu)):
            per_round = [t / h for t, h in zip(measured[name], measured["hand-written"])]
            low, high = median_interval(per_round)
            print(f"{name} / hand-written per round ({label}): {' '.join(f'{r:.3f}' for r in per_round)}; "
                  f"median {statistics.median(per_round):.3f} (95 % interval {low:.3f} to {high:.3f})")


if __name__ == "__main__":
    main()
