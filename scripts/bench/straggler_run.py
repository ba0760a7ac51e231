"""The straggler detector's workload: a run of several processes (``distributed=True``) in which one rank may be made
slow for some epochs, its compute (a sleep in a callback's batch end) or its data loader (a sleep in its collate
function), on that rank only. Run by the tests (tests/callbacks/monitoring/test_stragglers.py) and the benchmark
(scripts/bench/stragglers.py).

Usage: python straggler_run.py LOGDIR [--slow compute|data|none] [--rank R] [--from-epoch E] [--to-epoch E]
           [--epochs N] [--samples N] [--sleep-ms MS] [--nprocs N] [--no-stop] [--no-detector] [--count] [--mlflow]
           [--until-recovered]
The slow rank writes ``LOGDIR/slow-start.txt`` (the time of its first slow batch) and ``slow-end.txt`` (of the start
of its first epoch back at speed). ``--no-stop`` removes the graceful-stop callback (the detector then agrees on its
own), ``--no-detector`` the detector; ``--count`` writes ``LOGDIR/collectives-rank<r>.json``, the collectives of
each process group at the run's end. ``--until-recovered`` ends the run (a graceful stop, exit code 0) at the first
epoch end after the detector said the slow rank recovered, instead of running every epoch: the time a recovery
takes to say depends on the machine's load, so a fixed count of epochs is either too few or mostly waiting.
"""
import argparse
import json
import logging
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from torchstage import Callback, MLflowLogger, RunStopped, SupervisedRunner
from torchstage.launch.flight_recorder import recent
from torchstage.stop_request import request_stop

SLOW = {"on": False}
UNTIL_RECOVERED = 3  # the graceful stop's exit code under --until-recovered, which the run turns into 0


def slow_collate(batch):
    if SLOW["on"]:
        time.sleep(ARGS.sleep_ms / 1e3)
    return default_collate(batch)


class MakeSlow(Callback):
    """On the slow rank, from ``--from-epoch`` to ``--to-epoch``: a sleep per train batch in the part asked for."""

    def on_epoch_start(self, runner):
        mine = runner.engine.rank == ARGS.rank and ARGS.slow != "none"
        was = SLOW["on"]
        SLOW["on"] = mine and ARGS.from_epoch <= runner.epoch <= ARGS.to_epoch
        if SLOW["on"] and not was:
            _stamp("slow-start.txt")
        elif was and not SLOW["on"]:
            _stamp("slow-end.txt")

    def on_batch_end(self, runner):
        if SLOW["on"] and ARGS.slow == "compute" and runner.is_train_loader:
            time.sleep(ARGS.sleep_ms / 1e3)


class CountCollectives(Callback):
    """At the run's end: each process group's number of collectives (its last sequence number) on this rank."""

    def on_experiment_end(self, runner):
        counts = {}
        for entry in recent():
            counts[entry["group"]] = max(counts.get(entry["group"], 0), entry["seq"])
        with open(os.path.join(ARGS.logdir, f"collectives-rank{runner.engine.rank}.json"), "w") as f:
            f.write(json.dumps(counts))


class UntilRecovered(Callback, logging.Handler):
    """On rank 0 (which says the detector's findings): once the recovery line was logged, ask for a graceful stop
    at the epoch's end; the stop callback agrees it with the other ranks (each then ends with exit code 0, below)."""

    def __init__(self):
        Callback.__init__(self)
        logging.Handler.__init__(self)
        self.said = False

    def emit(self, record):
        self.said = self.said or record.getMessage().startswith("straggler recovered")

    def on_experiment_start(self, runner):
        logging.getLogger("torchstage").addHandler(self)

    def on_epoch_end(self, runner):
        if self.said:
            request_stop("the slow rank's recovery was said", exit_code=UNTIL_RECOVERED)

    def on_experiment_end(self, runner):
        logging.getLogger("torchstage").removeHandler(self)


def _stamp(name):
    with open(os.path.join(ARGS.logdir, name), "w") as f:
        f.write(repr(time.time()))


def main():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ARGS.samples, 32, generator=g)
    y = (x[:, :4].sum(1, keepdim=True) > 0).float()
    data = TensorDataset(x, y)
    collate = slow_collate if ARGS.slow == "data" else None
    loaders = {"train": DataLoader(data, batch_size=16, shuffle=True, collate_fn=collate,
                                   generator=torch.Generator().manual_seed(1)),
               "valid": DataLoader(data, batch_size=64)}
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    callbacks = {"make_slow": MakeSlow()}
    if ARGS.no_stop:
        callbacks["stop"] = None
    if ARGS.no_detector:
        callbacks["stragglers"] = None
    if ARGS.count:
        callbacks["count"] = CountCollectives()
    if ARGS.mlflow:
        callbacks["mlflow"] = MLflowLogger()
    if ARGS.until_recovered:
        callbacks["until_recovered"] = UntilRecovered()
    try:
        SupervisedRunner().train(model=model, criterion=nn.BCEWithLogitsLoss(),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.05), loaders=loaders,
                                 num_epochs=ARGS.epochs, logdir=ARGS.logdir, distributed=True, nprocs=ARGS.nprocs,
                                 callbacks=callbacks)
    except RunStopped as stopped:
        if not (ARGS.until_recovered and stopped.code == UNTIL_RECOVERED):
            raise


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("--slow", choices=("compute", "data", "none"), default="none")
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--from-epoch", type=int, default=3)
    parser.add_argument("--to-epoch", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--sleep-ms", type=float, default=15.0)
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--no-stop", action="store_true")
    parser.add_argument("--no-detector", action="store_true")
    parser.add_argument("--count", action="store_true")
    parser.add_argument("--mlflow", action="store_true", help="an MLflowLogger too (logdir/mlflow.db)")
    parser.add_argument("--until-recovered", action="store_true", help="stop once the recovery was said")
    ARGS = parser.parse_args()
    if os.environ.get("STRAGGLER_DEBUG"):  # each judged window's times (calibration)
        logging.basicConfig()
        logging.getLogger("torchstage").setLevel(logging.DEBUG)
    main()
