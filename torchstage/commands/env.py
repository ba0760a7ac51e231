"""``torchstage env``: how this process would run (rank, world, master, devices, backend) and who decided."""
import argparse
import json
import os
import sys

from torchstage.launch.resolve import detected, local_gpus, resolve_world, variables_read

EPILOG = """\
examples:
  torchstage env                          # on a laptop: a single process
  TORCHSTAGE_NPROC=2 torchstage env       # a CPU launch of 2 processes
  srun -N 2 torchstage env                # what each SLURM task would do
  torchrun --nproc-per-node=2 -m torchstage env
  mpirun -np 2 torchstage env             # Open MPI; also mpiexec (MPICH, PALS), jsrun (LSF)

The first thing to run when a cluster job hangs: every task should agree on the world size,
the master address and port, and each should have its own rank."""

def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "env", help="show how this process would run: rank, world size, master, devices, backend",
        description="Resolve the distributed world exactly as train() and distributed_cmd_run() would\n"
                    "(arguments > torchrun > SLURM job step > MPI launch: LSF jsrun, PBS/PALS, Open MPI,\n"
                    "MPICH > local launch > single process) and print it: which launcher decided, why, and\n"
                    "the variables it was read from. Starts nothing.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nprocs", type=int, help="processes to launch on this host, as train(nprocs=...) would")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=env_command)


def env_command(args) -> int:
    checked = [{"name": env.name, "applies": applies, "why": why} for env, applies, why in detected()]
    try:
        world = resolve_world(args.nprocs)
    except ValueError as exc:
        sys.stderr.write(f"torchstage env: error: {exc}\n")
        sys.stderr.write("".join(f"  {c['name']:<9} {_verdict(c)}\n" for c in checked))
        return 2
    info = {
        "source": world.source, "why": world.why, "rank": world.rank, "world_size": world.world_size,
        "local_rank": world.local_rank, "node_rank": world.node_rank, "spawn": world.spawn,
        "master_addr": world.master_addr,
        "master_port": world.master_port, "backend": world.backend, "gpus": local_gpus(),
        "host": os.uname().nodename, "pid": os.getpid(),
        "variables": {name: os.environ[name] for name in variables_read() if name in os.environ},
        "environments": checked,
    }
    if args.json:
        sys.stdout.write(json.dumps(info) + "\n")
        return 0
    role = (f"launcher of {world.spawn} local process(es), ranks {world.rank}..{world.rank + world.spawn - 1}"
            if world.spawn else f"rank {world.rank} of {world.world_size}")
    lines = [f"decided by:   {world.source}", f"why:          {world.why}", f"role:         {role}",
             f"local rank:   {world.local_rank}", f"node rank:    {world.node_rank}",
             f"world size:   {world.world_size}",
             f"master:       {world.master_addr}:{world.master_port or '(a free port, chosen at launch)'}",
             f"backend:      {world.backend}", f"GPUs visible: {info['gpus']}", f"host, pid:    {info['host']}, {info['pid']}"]
    lines += ["launchers checked (first that applies decides):"]
    lines += [f"  {c['name']:<9} {_verdict(c)}" for c in checked]
    lines += ["variables:"] + [f"  {name}={value}" for name, value in info["variables"].items()]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _verdict(row) -> str:
    """One launcher's line: applies (and from which variables), not present, or why it could not be read."""
    if row["applies"] is True:
        return f"applies: {row['why']}"
    return str(row["applies"]) if row["applies"] else "not present"
