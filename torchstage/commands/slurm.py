"""``torchstage slurm``: write, save or submit an sbatch script built by :mod:`torchstage.slurm_script`."""
import argparse
import os
import subprocess
import sys
from typing import Optional

from torchstage.slurm_script import SlurmScriptError, build_sbatch_script, load_sbatch_options, options_from_dict

_FLAGS = [("--job-name", str), ("--nodes", int), ("--ntasks-per-node", int), ("--gpus-per-node", int),
          ("--cpus-per-task", int), ("--partition", str), ("--account", str), ("--time", str),
          ("--output", str), ("--signal", str), ("--setup", str)]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``slurm``: build an sbatch script from flags and/or --config, print, save or submit it."""
    p = subparsers.add_parser(
        "slurm", help="write or submit an sbatch script for a run",
        description="Build an sbatch script (flags override --config). Example: "
                    "torchstage slurm --nodes 2 --gpus-per-node 4 --time 1:00:00 -- python train.py")
    p.add_argument("--config", metavar="FILE.yml", help="YAML file of options (keys as the flags, '_' or '-')")
    for flag, typ in _FLAGS:
        p.add_argument(flag, type=typ, default=None)
    p.add_argument("--module", dest="modules", action="append", default=None, help="module to load (repeatable)")
    p.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--save", metavar="PATH", help="write the script to PATH instead of printing it")
    p.add_argument("--submit", action="store_true", help="submit with sbatch and print the job id")
    p.add_argument("--wait", action="store_true", help="with --submit: wait for the job, exit with its code")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each task runs (after --)")
    p.set_defaults(func=run_slurm_command)
    return p


def run_slurm_command(args: argparse.Namespace) -> int:
    """Run ``torchstage slurm``; returns the exit code (2 for bad options, sbatch's code when submitting)."""
    command = list(args.command or [])
    if command[:1] == ["--"]:
        command = command[1:]
    given = {name.lstrip("-").replace("-", "_"): getattr(args, name.lstrip("-").replace("-", "_"))
             for name, _ in _FLAGS}
    given.update(modules=args.modules, requeue=args.requeue, command=command or None)
    try:
        if args.config:
            opts = load_sbatch_options(args.config, **given)
        else:
            opts = options_from_dict({k: v for k, v in given.items() if v is not None}, "torchstage slurm")
        script = build_sbatch_script(opts)
    except SlurmScriptError as e:
        sys.stderr.write(f"torchstage slurm: error: {e}\n")
        return 2
    if args.save:
        with open(args.save, "w") as f:
            f.write(script)
        os.chmod(args.save, 0o755)
        sys.stderr.write(f"saved {args.save}\n")
    elif not args.submit:
        sys.stdout.write(script)
    return _submit(script, args.save, args.wait) if args.submit else 0


def _submit(script: str, path: Optional[str], wait: bool) -> int:
    """sbatch PATH (or the script on stdin); print the job id as soon as sbatch reports it."""
    cmd = ["sbatch", "--parsable"] + (["--wait"] if wait else []) + ([path] if path else [])
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL if path else subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    except FileNotFoundError:
        sys.stderr.write("torchstage slurm: error: sbatch not found: --submit needs the SLURM client tools\n")
        return 2
    if not path:
        proc.stdin.write(script)
        proc.stdin.close()
    for line in proc.stdout:  # "JOBID" or "JOBID;CLUSTER"
        sys.stdout.write(line.strip().split(";")[0] + "\n")
        sys.stdout.flush()
    return proc.wait()
