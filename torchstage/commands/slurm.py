"""``torchstage slurm``: write, save or submit an sbatch script built by :mod:`torchstage.launch.slurm.sbatch`."""
import argparse
import os
import subprocess
import sys
from typing import Optional

from torchstage.launch.slurm.sbatch import SlurmScriptError, build_sbatch_script, load_sbatch_options, options_from_dict

_FLAGS = [("--job-name", str), ("--nodes", int), ("--ntasks-per-node", int), ("--gpus-per-node", int),
          ("--gres", str), ("--cpus-per-task", int), ("--partition", str), ("--account", str), ("--qos", str),
          ("--constraint", str), ("--time", str), ("--output", str), ("--signal", str), ("--mail-type", str),
          ("--mail-user", str), ("--launcher", str), ("--nproc-per-node", int)]
EPILOG = """\
examples:
  torchstage slurm --nodes 2 --gpus-per-node 4 --ntasks-per-node 4 --time 1:00:00 -- python train.py
  torchstage slurm --launcher torchrun --nodes 2 --gpus-per-node 4 --account proj --qos normal \\
      --module cuda/12.1 --setup 'source venv/bin/activate' --dry-run -- python train.py
  torchstage slurm --config job.yml --submit --wait

Nothing site-specific is built in: account, partition, qos, constraint, --gres or --gpus-per-node,
modules, setup lines, the preemption signal and its lead time (--signal USR1@120), mail, and any
other directive (--sbatch=--exclusive) come from these flags or the YAML file."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``slurm``: build an sbatch script from flags and/or --config, print, save or submit it."""
    p = subparsers.add_parser(
        "slurm", help="write or submit an sbatch script for a run",
        description="Build an sbatch script (flags override --config); print it, save it or submit it.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE.yml", help="YAML file of options (keys as the flags, '_' or '-')")
    for flag, typ in _FLAGS:
        p.add_argument(flag, type=typ, default=None)
    p.add_argument("--module", dest="modules", action="append", default=None, help="module to load (repeatable)")
    p.add_argument("--setup", action="append", default=None,
                   help="shell line run before the launch, e.g. 'source venv/bin/activate' (repeatable)")
    p.add_argument("--sbatch", action="append", default=None, metavar="DIRECTIVE",
                   help="any other #SBATCH directive, e.g. --sbatch=--exclusive (repeatable)")
    p.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--save", metavar="PATH", help="write the script to PATH instead of printing it")
    p.add_argument("--submit", action="store_true", help="submit with sbatch and print the job id")
    p.add_argument("--wait", action="store_true", help="with --submit: wait for the job, exit with its code")
    p.add_argument("--dry-run", action="store_true", help="print the script and stop (nothing saved or submitted)")
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
    given.update(modules=args.modules, setup=args.setup, sbatch=args.sbatch, requeue=args.requeue,
                 command=command or None)
    try:
        if args.config:
            opts = load_sbatch_options(args.config, **given)
        else:
            opts = options_from_dict({k: v for k, v in given.items() if v is not None}, "torchstage slurm")
        script = build_sbatch_script(opts)
    except SlurmScriptError as e:
        sys.stderr.write(f"torchstage slurm: error: {e}\n")
        return 2
    if args.dry_run:
        sys.stdout.write(script)
        return 0
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
