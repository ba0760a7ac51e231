"""The pre-flight check across a world: every rank runs the probes at the same moments, the figures are gathered
on every rank, and every rank reaches the same verdict (so all exit, or all go on to train, alike).

Each probe is repeated (``repeats`` times, interleaved: matmul, memory, the exchange rounds; every rank starting
each one after a barrier) and ranks are compared repeat by repeat (:func:`~.verdict.outliers`): a rank slowed for
a moment by a neighbour is not an outlier, one slowed throughout is.
"""
import contextlib
import logging
import os
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from torchstage.launch.failures import record_stop
from torchstage.launch.hosts import host_name, in_slurm_job
from torchstage.launch.preflight import probes
from torchstage.launch.node_load import node_ticks
from torchstage.launch.preflight.verdict import RankFigures, excluded, found_text, outliers, report
from torchstage.launch.world import World
from torchstage.logging_setup import ensure_console_handler

logger = logging.getLogger("torchstage")
REPEATS, SECONDS, THRESHOLD = 5, 0.15, 0.2


class PreflightFailed(SystemExit):
    """``train(preflight=True)`` found ranks slower than the others, so training did not start. Raised on every rank
    after the main rank logged the report; uncaught, it ends the process with exit code 1 (as ``torchstage
    preflight`` does), without a traceback: :attr:`result` holds the figures, ``str()`` the report and the advice
    (under SLURM the ``--exclude`` to resubmit without the slow nodes)."""

    def __init__(self, result: "Preflight"):
        super().__init__(1)
        self.result = result

    def __str__(self):
        return (f"the pre-flight check found slow ranks, so training did not start:\n{self.result.text}\n"
                f"resubmit without those nodes, or pass train(preflight=False) to train on them anyway")


@dataclass
class Preflight:
    """The gathered figures, the outliers, the all-reduce bus bandwidth, the report text and the hosts to exclude."""

    ranks: list
    outliers: list
    all_reduce: Optional[float]
    text: str
    exclude: list

    @property
    def exit_code(self) -> int:
        """0 when every rank agrees, 1 when there is an outlier."""
        return 1 if self.outliers else 0


def run_preflight(world: World = None, repeats: int = REPEATS, seconds: float = SECONDS,
                  threshold: float = THRESHOLD) -> Preflight:
    """Run the check as this process's rank of ``world`` (whose process group is initialised; None: one process);
    collective: every rank calls it. With GPUs (the NCCL backend) it probes the rank's GPU, else the CPU."""
    world = world or World()
    distributed = world.is_distributed
    device = torch.device("cuda", torch.cuda.current_device()) if world.backend == "nccl" else torch.device("cpu")
    rank = world.rank
    place = (host_name(), world.local_rank, socket.gethostname(), len(os.sched_getaffinity(0)))
    places = _gather(place, distributed)
    nodes = {}
    for r, (host, *_) in enumerate(places):
        nodes.setdefault(host, []).append(r)
    machine = [p for p in places if p[2] == place[2]]  # the ranks on this machine, and the CPUs they may use
    crowding = len(machine) / max(1, max(p[3] for p in machine))
    pairs = probes.rounds(nodes) if distributed else []
    ticks, started, cpu = node_ticks(), time.monotonic(), time.process_time()  # how busy the node is besides
    with _threads(device):
        device_name = _device_name(device)
        memory = probes.HostMemory()
        matmul, copies, link, links = [], [], [], {}
        for _ in range(repeats):  # interleaved, each probe started by every rank together
            _barrier(distributed)
            matmul.append(probes.matmul(device, seconds))
            _barrier(distributed)
            copies.append(memory.probe(seconds))
            seen = []
            for round_ in pairs:
                _barrier(True)
                for a, b in round_:
                    if rank in (a, b):
                        peer = b if rank == a else a
                        seen.append(probes.exchange(peer, device))
                        links.setdefault(peer, []).append(seen[-1])
            if seen:
                link.append(statistics.median(seen))
        del memory
        bus = probes.all_reduce(device) if distributed else None
    mine = RankFigures(rank, place[0], place[1], device_name, matmul, copies, link,
                       {peer: statistics.median(values) for peer, values in links.items()},
                       judge_link=device.type == "cuda" or len(nodes) > 1,
                       crowding=crowding if device.type == "cpu" else 1.0,
                       cpu_seconds=time.process_time() - cpu, wall=time.monotonic() - started,
                       cpus=float(os.cpu_count() or 1), node_ticks=(ticks, node_ticks()))
    ranks = _gather(mine, distributed)
    found = outliers(ranks, threshold)
    slurm = in_slurm_job()
    return Preflight(ranks, found, bus, report(ranks, found, bus, threshold, slurm), excluded(found, ranks))


def check_before_training(world: World) -> Preflight:
    """``train(preflight=True)``: the check before the first epoch, on every rank of ``world``; the main rank logs the
    report (a warning when a rank is an outlier); then every rank raises :class:`PreflightFailed`, recorded as a
    stop for a launcher of torchstage's, which then does not start the run again on the same nodes."""
    ensure_console_handler()  # before the run's own set-up: the report must show
    result = run_preflight(world)
    if world.rank == 0:
        (logger.warning if result.outliers else logger.info)("pre-flight check:\n%s", result.text)
    if result.outliers:
        record_stop(world.rank, f"the pre-flight check found {found_text(result.outliers)}", {})
        raise PreflightFailed(result)
    return result


def _gather(obj, distributed: bool) -> list:
    if not distributed:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _barrier(distributed: bool) -> None:
    if distributed:
        dist.barrier()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index} {torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} thread{'s' * (torch.get_num_threads() > 1)})"


@contextlib.contextmanager
def _threads(device: torch.device):
    """On a CPU, one torch thread per rank while the probes run (the setting before is restored): ranks measured on
    one thread each compare like with like, where ranks whose OpenMP threads outnumber their cores measure the
    scheduler (a 256x256 matmul on 2 threads of a busy 2-core machine runs 15 times slower than on one)."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
