"""sbatch scripts for torchstage runs: options (flags or a short YAML file) -> script text.

Plain functions, usable from Python; the ``torchstage slurm`` command is :mod:`torchstage.commands.slurm`.
"""
import re
import shlex
from dataclasses import dataclass, field, fields
from typing import List, Optional, Union

import yaml


class SlurmScriptError(ValueError):
    """Options that cannot make a working sbatch script."""


@dataclass
class SbatchOptions:
    """What goes into the script; every site-specific line comes from here, nothing is built in.

    ``launcher="srun"``: ``command`` runs once per task under srun (one task per GPU, or one per node
    spawning a process per GPU). ``launcher="torchrun"``: srun starts one torchrun per node, which
    starts ``nproc_per_node`` copies of ``command`` and forms the world (c10d rendezvous on the first node).
    """

    command: Union[str, List[str]]
    job_name: str = "torchstage"
    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    time: Optional[str] = None
    output: Optional[str] = None
    modules: List[str] = field(default_factory=list)
    setup: Union[str, List[str]] = ""  # shell lines run before srun (venv activation, exports)
    signal: Optional[str] = None   # e.g. "USR1@120": sent to the srun tasks that long before the time limit
    requeue: bool = False
    qos: Optional[str] = None
    constraint: Optional[str] = None
    gres: Optional[str] = None     # e.g. "gpu:4" where the site asks for --gres instead of --gpus-per-node
    mail_type: Optional[str] = None  # e.g. "END,FAIL"
    mail_user: Optional[str] = None
    sbatch: List[str] = field(default_factory=list)  # any other directive, e.g. ["--exclusive", "--mem=0"]
    launcher: str = "srun"         # "srun" or "torchrun"
    nproc_per_node: Optional[int] = None  # torchrun form: processes per node (default: gpus_per_node, else 1)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise SlurmScriptError naming the option, the value given and what is expected."""
        if not self.command or (isinstance(self.command, list) and not all(isinstance(c, str) for c in self.command)):
            raise SlurmScriptError(f"command: expected a command line (string or list of strings), got {self.command!r}")
        for name in ("nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "nproc_per_node"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise SlurmScriptError(f"{name}: expected a positive integer, got {value!r}")
        if self.time is not None and not isinstance(self.time, str):  # YAML reads unquoted 12:00:00 as 43200
            raise SlurmScriptError(f"time: expected a string such as '12:00:00' (quote it in YAML), got {self.time!r}")
        for name in ("job_name", "partition", "account", "time", "output", "signal", "qos", "constraint", "gres",
                     "mail_type", "mail_user"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not re.fullmatch(r"[^\s#]+", value)):
                raise SlurmScriptError(f"{name}: expected one word without spaces or '#', got {value!r}")
        if self.time and not re.fullmatch(r"\d+(-\d+)?(:\d+){0,2}|UNLIMITED|INFINITE", self.time):
            raise SlurmScriptError(f"time: expected MM, HH:MM:SS or D-HH:MM:SS, got {self.time!r}")
        if self.signal and self.signal.startswith("B:"):
            raise SlurmScriptError(f"signal: {self.signal!r} would reach only the batch shell, not the srun tasks "
                                   f"that train; use {self.signal[2:]!r}")
        if self.signal and not re.fullmatch(r"[A-Z0-9]+(@\d+)?", self.signal):
            raise SlurmScriptError(f"signal: expected SIGNAL@SECONDS such as 'USR1@120', got {self.signal!r}")
        if not isinstance(self.modules, list) or not all(isinstance(m, str) and m.split() == [m] for m in self.modules):
            raise SlurmScriptError(f"modules: expected a list of module names, got {self.modules!r}")
        if isinstance(self.setup, list) and all(isinstance(line, str) for line in self.setup):
            self.setup = "\n".join(self.setup)
        if not isinstance(self.setup, str) or not isinstance(self.requeue, bool):
            raise SlurmScriptError(f"setup must be a string or a list of lines and requeue true/false, got "
                                   f"{self.setup!r}, {self.requeue!r}")
        if self.gres is not None and self.gpus_per_node is not None:
            raise SlurmScriptError(f"gres={self.gres!r} and gpus_per_node={self.gpus_per_node!r}: give one of them "
                                   f"(the one your site documents), not both")
        if not isinstance(self.sbatch, list) or not all(
                isinstance(d, str) and re.fullmatch(r"--[\w-]+(=[^\s#]+)?", d) for d in self.sbatch):
            raise SlurmScriptError(f"sbatch: expected a list of directives such as ['--exclusive', '--mem=0'], "
                                   f"got {self.sbatch!r}")
        if self.launcher not in ("srun", "torchrun"):
            raise SlurmScriptError(f"launcher: expected 'srun' or 'torchrun', got {self.launcher!r}")
        if self.launcher == "torchrun" and self.ntasks_per_node != 1:
            raise SlurmScriptError(f"ntasks_per_node={self.ntasks_per_node!r} with launcher='torchrun': srun starts "
                                   f"one torchrun per node (ntasks_per_node=1), torchrun starts nproc_per_node "
                                   f"processes; use launcher='srun' for one task per GPU")
        if (self.launcher == "srun" and self.gpus_per_node is not None
                and self.ntasks_per_node not in (1, self.gpus_per_node)):
            raise SlurmScriptError(f"ntasks_per_node={self.ntasks_per_node!r} with gpus_per_node="
                                   f"{self.gpus_per_node!r}: each task must own one GPU or a whole node, so use "
                                   f"ntasks_per_node={self.gpus_per_node} (one task per GPU) or 1 (one task per "
                                   f"node, spawning a process per GPU)")
        if self.nproc_per_node is not None and self.launcher != "torchrun":
            raise SlurmScriptError(f"nproc_per_node={self.nproc_per_node!r} is for launcher='torchrun'; with srun "
                                   f"use ntasks_per_node")


#: ``--requeue`` without ``--signal``: SIGUSR1 two minutes before the time limit, which the run's requeue
#: callback turns into a checkpoint, a graceful stop and ``scontrol requeue``.
REQUEUE_SIGNAL = "USR1@120"


def build_sbatch_script(opts: SbatchOptions) -> str:
    """The sbatch script text: #SBATCH directives, modules, setup, then the srun (or srun + torchrun) line."""
    opts.validate()
    directives = [("job-name", opts.job_name), ("nodes", opts.nodes), ("ntasks-per-node", opts.ntasks_per_node),
                  ("gpus-per-node", opts.gpus_per_node), ("gres", opts.gres), ("cpus-per-task", opts.cpus_per_task),
                  ("partition", opts.partition), ("account", opts.account), ("qos", opts.qos),
                  ("constraint", opts.constraint), ("time", opts.time), ("output", opts.output),
                  ("signal", opts.signal), ("mail-type", opts.mail_type), ("mail-user", opts.mail_user)]
    lines = ["#!/bin/bash"] + [f"#SBATCH --{k}={v}" for k, v in directives if v is not None]
    lines += [f"#SBATCH {d}" for d in opts.sbatch]
    if opts.requeue:  # a requeued job restarts the script: append to its log instead of truncating it
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
        if opts.signal is None:  # the warning before the time limit that lets the run checkpoint and requeue
            lines.append(f"#SBATCH --signal={REQUEUE_SIGNAL}")
    lines += ["", "set -eo pipefail"]
    lines += [f"module load {m}" for m in opts.modules]
    if opts.setup.strip():
        lines.append(opts.setup.strip())
    command = opts.command if isinstance(opts.command, str) else shlex.join(opts.command)
    srun = ["srun", "--kill-on-bad-exit=1"]  # one failing task ends the step instead of a collective timeout
    if opts.cpus_per_task:  # srun does not inherit --cpus-per-task from sbatch on SLURM 22.05+
        srun.append(f"--cpus-per-task={opts.cpus_per_task}")
    if opts.launcher == "torchrun":
        lines += _torchrun_lines(opts, srun, command)
    else:
        lines.append(" ".join(srun) + " " + command)
    return "\n".join(lines) + "\n"


def _torchrun_lines(opts: SbatchOptions, srun: list, command: str) -> list:
    """srun starts one torchrun per node; they meet at the first node on a port derived from the job id."""
    nproc = opts.nproc_per_node or opts.gpus_per_node or 1
    return [
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "# one port per job id, below Linux's ephemeral ports: two jobs on a node never collide",
        "rdzv_port=$((15000 + SLURM_JOB_ID % 15000))",
        " ".join(srun) + " --ntasks-per-node=1 torchrun --nnodes=\"$SLURM_JOB_NUM_NODES\" "
        f"--nproc-per-node={nproc} --rdzv-id=\"$SLURM_JOB_ID\" --rdzv-backend=c10d "
        f"--rdzv-endpoint=\"$head_node:$rdzv_port\" --no-python {command}"]


def options_from_dict(data: dict, source: str = "options") -> SbatchOptions:
    """SbatchOptions from a mapping (keys with '-' or '_'); unknown keys raise naming the key."""
    if not isinstance(data, dict):
        raise SlurmScriptError(f"{source}: expected a mapping of options, got {type(data).__name__}")
    known = {f.name for f in fields(SbatchOptions)}
    kwargs = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise SlurmScriptError(f"{source}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        kwargs[name] = value
    if not kwargs.get("command"):
        raise SlurmScriptError(f"{source}: no command given (the command each task runs, e.g. 'python train.py')")
    try:
        return SbatchOptions(**kwargs)
    except SlurmScriptError as e:
        raise SlurmScriptError(f"{source}: {e}") from None


def load_sbatch_options(path: str, **overrides) -> SbatchOptions:
    """Options from a short YAML file, then ``overrides`` (values that are None are ignored)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SlurmScriptError(f"cannot read {path}: {e}") from None
    if isinstance(data, dict):
        data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    return options_from_dict(data, path)
