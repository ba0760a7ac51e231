"""Which nodes a world is made of, and how it changed: the lost node and the one that joined, by host and ranks.

A node is the host and the launcher agent its processes were started by (their parent process: torchrun's
agent, torchstage's launcher, a SLURM step's daemon): two agents on one host are two nodes. The world's
membership is gathered once as a run starts and kept in its checkpoints; a run resumed by another world (an
elastic ``torchrun --nnodes=MIN:MAX`` job that lost a node, or that one came back to) names what changed.
"""
import os
import socket

from torchstage.launch.resolve import launcher_attempt, restart_attempt, set_agreed_attempt
from torchstage.launch.startup_waits import ranges


def this_node() -> dict:
    """``{"host": ..., "agent": pid}`` of this process."""
    return {"host": socket.gethostname(), "agent": os.getppid()}


def agree_membership(gather) -> tuple:
    """``(nodes, restarts)`` of this world, with one all-gather (``gather``: of a value, in rank order): its nodes,
    each ``{"host", "agent", "ranks"}`` in the order of their first rank, and the largest count of launcher restarts
    of its ranks. The restart count every rank reports from now on is the largest of theirs: under ``torchrun
    --nnodes=MIN:MAX`` a node that returns starts a new agent, whose workers count 0 restarts while the others count
    theirs, and the run, its logs and its lock are those of the one job all the same."""
    seen = gather((this_node(), restart_attempt(), launcher_attempt()))
    set_agreed_attempt(max(count for _, count, _ in seen) if len(seen) > 1 else 0)  # one process: its own count
    nodes = {}
    for rank, (node, _, _) in enumerate(seen):
        nodes.setdefault((node["host"], node["agent"]), {**node, "ranks": []})["ranks"].append(rank)
    return list(nodes.values()), max(count for _, _, count in seen)


def describe(node: dict, world_size: int = None) -> str:
    """``host-b (agent pid 4242) with ranks 2-3`` (``of 4`` with ``world_size``; no agent for a node by host)."""
    of = f" of {world_size}" if world_size else ""
    agent = f" (agent pid {node['agent']})" if node.get("agent") is not None else ""
    return f"{node['host']}{agent} with rank{'s' * (len(node['ranks']) > 1)} {ranges(node['ranks'])}{of}"


def by_host(nodes: list) -> list:
    """The nodes of ``nodes`` merged per host (no agent): how another job's world compares with this one's."""
    hosts = {}
    for node in nodes:
        hosts.setdefault(node["host"], {"host": node["host"], "agent": None, "ranks": []})["ranks"].extend(node["ranks"])
    return [{**node, "ranks": sorted(node["ranks"])} for node in hosts.values()]


def changes(before: list, now: list, by_agent: bool = True) -> list:
    """What changed from the world ``before`` to ``now``: ``lost node ...`` and ``joined: node ...`` phrases, by host
    and agent (``by_agent=False``: by host only, for a world of another job, whose agents are new anyway); empty when
    the same nodes hold the same ranks."""
    if not by_agent:
        before, now = by_host(before), by_host(now)
    key = lambda node: (node["host"], node["agent"])  # noqa: E731
    old, new = {key(n): n for n in before}, {key(n): n for n in now}
    size_before = sum(len(n["ranks"]) for n in before)
    size_now = sum(len(n["ranks"]) for n in now)
    said = [f"lost node {describe(old[k], size_before)}" for k in old if k not in new]
    said += [f"joined node {describe(new[k], size_now)}" for k in new if k not in old]
    said += [f"node {describe(new[k])} was ranks {ranges(old[k]['ranks'])}" for k in new
             if k in old and new[k]["ranks"] != old[k]["ranks"]]
    return said
