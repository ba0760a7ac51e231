"""A world that torchrun re-formed around a node that joined (or left) without a failure is the same job going on:
torchrun restarts the workers for the new membership without counting a restart, so the run's own restart count
cannot tell it from a new launch. The checkpoint can: it was written by this torchelastic run, by an agent that is
still in this world, before this process started. Such a world continues the run, whatever ``overwrite`` says
(``overwrite=True`` replaces the run of another launch, never the job's own)."""
import os
from datetime import datetime
from typing import Optional

from torchstage.launch.resolve import job_identity


def joined_world(checkpoint: dict, nodes: list) -> Optional[str]:
    """Why the run of ``checkpoint`` is this elastic job's own, continued by a re-formed world of ``nodes`` (this
    world's nodes, :func:`~torchstage.launch.membership.agree_membership`); None when it is not (not a torchelastic
    job, another run id, no agent in common, or this process was alive when it was written)."""
    meta = checkpoint.get("meta", {})
    run = job_identity().get("torchelastic_run")
    if not run or meta.get("job", {}).get("torchelastic_run") != run:
        return None
    agents = {(node["host"], node["agent"]) for node in meta.get("nodes") or []}
    common = sorted(agents & {(node["host"], node["agent"]) for node in nodes or []})
    written, started = _written(meta.get("time")), process_start()
    if not common or written is None or started is None or started <= written:
        return None
    host, agent = common[0]
    return (f"it was written by this torchelastic run ({run}), whose agent pid {agent} on {host} is in this world, "
            f"before these workers started: torchrun re-formed the world (a node joined or left)")


def process_start() -> Optional[float]:
    """When this process started (seconds since the epoch), from /proc; None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _written(stamp) -> Optional[float]:
    """The checkpoint's ``meta.time`` (``2026-11-29T04:16:45+0000``) as seconds since the epoch."""
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (TypeError, ValueError):
        return None
