"""`torchstage preflight` as one task of a SLURM step, slowed on request by its node (``SLURM_NODEID`` k):
``PIN_NODE<k>=<cpu>`` pins every thread of the task to that CPU, ``NICE_NODE<k>=<n>`` lowers their priority by n
(and its session's, where the kernel shares CPU time between sessions: ``/proc/self/autogroup``).
torch and torchstage are imported first, so a task to be slowed starts as fast as the others.

Usage (each task): python pinned_preflight.py [preflight options]
"""
import os
import sys

import torch  # noqa: F401 (imported before the task is slowed)

from torchstage.cli import main

if __name__ == "__main__":
    node = os.environ.get("SLURM_NODEID", "")
    cpu, nice = os.environ.get(f"PIN_NODE{node}", ""), os.environ.get(f"NICE_NODE{node}", "")
    for task in map(int, os.listdir("/proc/self/task")):
        if cpu:
            os.sched_setaffinity(task, {int(cpu)})
        if nice:
            os.setpriority(os.PRIO_PROCESS, task, int(nice))
    if nice and os.path.exists("/proc/self/autogroup"):
        with open("/proc/self/autogroup", "w") as f:
            f.write(nice)
    sys.exit(main(["preflight", *sys.argv[1:]]))
