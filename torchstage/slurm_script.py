"""sbatch scripts for torchstage runs: options (flags or a short YAML file) -> script text.

Plain functions, usable from Python; the ``torchstage slurm`` command is :mod:`torchstage.commands.slurm`.
"""
import re
import shlex
from dataclasses import dataclass, field, fields
from typing import List, Optional, Union


class SlurmScriptError(ValueError):
    """Options that cannot make a working sbatch script."""


@dataclass
class SbatchOptions:
    """What goes into the script. ``command`` runs once per task under ``srun``."""

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
    setup: str = ""                # shell lines run before srun (venv activation, exports)
    signal: Optional[str] = None   # e.g. "USR1@120": sent to the srun tasks that long before the time limit
    requeue: bool = False

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise SlurmScriptError naming the option, the value given and what is expected."""
        if not self.command or (isinstance(self.command, list) and not all(isinstance(c, str) for c in self.command)):
            raise SlurmScriptError(f"command: expected a command line (string or list of strings), got {self.command!r}")
        for name in ("nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise SlurmScriptError(f"{name}: expected a positive integer, got {value!r}")
        if self.time is not None and not isinstance(self.time, str):  # YAML reads unquoted 12:00:00 as 43200
            raise SlurmScriptError(f"time: expected a string such as '12:00:00' (quote it in YAML), got {self.time!r}")
        for name in ("job_name", "partition", "account", "time", "output", "signal"):
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
        if not isinstance(self.setup, str) or not isinstance(self.requeue, bool):
            raise SlurmScriptError(f"setup must be a string and requeue true/false, got {self.setup!r}, {self.requeue!r}")


def build_sbatch_script(opts: SbatchOptions) -> str:
    """The sbatch script text: #SBATCH directives, modules, setup, then ``srun --kill-on-bad-exit=1 command``."""
    opts.validate()
    directives = [("job-name", opts.job_name), ("nodes", opts.nodes), ("ntasks-per-node", opts.ntasks_per_node),
                  ("gpus-per-node", opts.gpus_per_node), ("cpus-per-task", opts.cpus_per_task),
                  ("partition", opts.partition), ("account", opts.account), ("time", opts.time),
                  ("output", opts.output), ("signal", opts.signal)]
    lines = ["#!/bin/bash"] + [f"#SBATCH --{k}={v}" for k, v in directives if v is not None]
    if opts.requeue:  # a requeued job restarts the script: append to its log instead of truncating it
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    lines += ["", "set -eo pipefail"]
    lines += [f"module load {m}" for m in opts.modules]
    if opts.setup.strip():
        lines.append(opts.setup.strip())
    command = opts.command if isinstance(opts.command, str) else shlex.join(opts.command)
    srun = ["srun", "--kill-on-bad-exit=1"]  # one failing task ends the step instead of a collective timeout
    if opts.cpus_per_task:  # srun does not inherit --cpus-per-task from sbatch on SLURM 22.05+
        srun.append(f"--cpus-per-task={opts.cpus_per_task}")
    lines.append(" ".join(srun) + " " + command)
    return "\n".join(lines) + "\n"


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
    import yaml
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SlurmScriptError(f"cannot read {path}: {e}") from None
    if isinstance(data, dict):
        data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    return options_from_dict(data, path)
