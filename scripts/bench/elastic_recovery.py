"""Time from a node's loss to training again, and from its return to training at the full size again, under an
elastic ``torchrun --nnodes=1:2`` job of two agents of 2 processes on this host (gloo).

Each round: the two agents train (``elastic_worker.py``); the second agent and its workers are killed with SIGKILL;
the first agent's workers fail, it restarts them, and the 2 processes left resume from the last checkpoint
(written every 5 batches): "loss -> training" is from the kill to their first batch. Then the second agent's
command starts again: the first agent ends its workers (a graceful stop, checkpoint at the batch), both agents
form a world of 4 that resumes: "return -> training" is from the start of the returning command to the first batch
of 4 processes. Each is split into: until the new workers' processes start (the failure seen, torchrun's
rendezvous), their setup (imports, the process group, the data, the checkpoint loaded: until the run's first
event) and until the first batch (the loader resumed). Batches trained between the last checkpoint and the loss
are trained again ("redone").
torchrun's settings are the ones docs/distributed.md gives: ``--rdzv-conf=last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3``,
``--monitor-interval=0.5``, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.
Usage: python scripts/bench/elastic_recovery.py [--rounds 3] [--keep FOLDER]
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_worker.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> list:
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parent = int(open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def rows(logdir) -> list:
    path = os.path.join(logdir, "batches.jsonl")
    return [json.loads(line) for line in open(path) if line.endswith("\n")] if os.path.exists(path) else []


def batches(logdir) -> list:
    return [row for row in rows(logdir) if "batch" in row]


def started(logdir, world: int, after: float) -> dict:
    """The start row of the first run of ``world`` processes begun after ``after``."""
    return next(row for row in rows(logdir) if row.get("event") == "started" and row["world"] == world
                and row["at"] > after)


def wait_for(condition, what: str, seconds: float = 240):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise TimeoutError(f"waited {seconds} s for {what}")


def one_round(folder: str, index: int) -> dict:
    logdir = os.path.join(folder, f"round-{index}")
    os.makedirs(logdir)
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "CUDA_VISIBLE_DEVICES": ""}
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id=bench-{index}",
            "--max-restarts=3", "--rdzv-conf=last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3",
            "--monitor-interval=0.5", WORKER, logdir, "50"]
    out = open(os.path.join(logdir, "agents.log"), "w")
    procs = [subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)]
    time.sleep(1)
    procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        wait_for(lambda: any(row["world"] == 4 and row["batch"] >= 23 for row in batches(logdir)), "4 processes")
        lost_at = time.time()
        before = max(row["batch"] for row in batches(logdir))
        for pid in descendants(procs[1].pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shrunk = wait_for(lambda: [r for r in batches(logdir) if r["world"] == 2], "2 processes training")[0]
        wait_for(lambda: len([r for r in batches(logdir) if r["world"] == 2]) >= 10, "10 batches of 2 processes")
        returned_at = time.time()
        procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        grown = wait_for(lambda: [r for r in batches(logdir) if r["world"] == 4 and r["t"] > returned_at],
                         "4 processes again")[0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    small, full = started(logdir, 2, lost_at), started(logdir, 4, returned_at)
    return {"loss -> training": shrunk["t"] - lost_at, "loss: to the workers' start": small["at"] - lost_at,
            "loss: their setup": small["t"] - small["at"], "loss: to the first batch": shrunk["t"] - small["t"],
            "return -> training": grown["t"] - returned_at, "return: to the workers' start": full["at"] - returned_at,
            "return: their setup": full["t"] - full["at"], "return: to the first batch": grown["t"] - full["t"],
            "redone": before - shrunk["batch"] + 1}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", help="a folder to keep each round's logdir and agents' log in")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as scratch:
        folder = args.keep or scratch
        for index in range(args.rounds):
            results.append(one_round(folder, index))
            print(f"round {index + 1}: " + "; ".join(f"{k} {v:.1f} s" if k != "redone" else f"{k} {v} batches"
                                                    for k, v in results[-1].items()), flush=True)
    for key in results[0]:
        values = [r[key] for r in results]
        print(f"{key}: median {statistics.median(values):.1f}{' s' if key != 'redone' else ' batches'} "
              f"(min {min(values):.1f}, max {max(values):.1f}) over {len(values)} rounds")


if __name__ == "__main__":
    main()
