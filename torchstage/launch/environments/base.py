"""What every launcher environment answers: does it apply, and where does this process sit."""
import os
import socket
from typing import Mapping, Optional, Tuple

from torchstage.launch.world import World


class LaunchError(ValueError):
    """Launcher variables (or their absence) that cannot give a working distributed run."""


class LauncherEnvironment:
    """One launcher: ``applies`` says whether it started this process, ``place`` its :class:`World`.

    ``name`` becomes ``World.source``; ``variables`` are the names it reads, which ``torchstage env`` shows.
    """

    name: str = ""
    command: str = ""
    variables: Tuple[str, ...] = ()

    def applies(self, environ: Mapping) -> bool:
        raise NotImplementedError

    def why(self, environ: Mapping) -> str:
        """The variables that made this environment apply, as ``NAME=value`` text."""
        shown = [f"{k}={environ[k]}" for k in self.variables if environ.get(k, "") != ""]
        return ", ".join(shown[:4]) or "(none)"

    def place(self, environ: Mapping, local_devices: int) -> World:
        """This process's world as the launcher describes it (``spawn > 0``: start that many locally)."""
        raise NotImplementedError

    def ranks(self, environ: Mapping) -> int:
        """How many processes the launcher started into this process's world (read from its variables alone)."""
        raise NotImplementedError

    def job_id(self, environ: Mapping) -> Optional[str]:
        """An id every process of this launch reads alike, without talking to the others; None if it has none."""
        return None


def int_var(environ: Mapping, name: str) -> int:
    """``environ[name]`` as an int, or LaunchError naming the variable and its value."""
    try:
        return int(environ[name])
    except KeyError:
        raise LaunchError(f"environment variable {name} is not set") from None
    except ValueError:
        raise LaunchError(f"environment variable {name} must be an integer, got {environ[name]!r}") from None


def int_var_or(environ: Mapping, name: str, default):
    """``environ[name]`` as an int where it is set (and not empty), else ``default``."""
    return int_var(environ, name) if environ.get(name, "") != "" else default


def check_place(rank: int, world_size: int, rank_name: str, size_name: str) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise LaunchError(f"{rank_name}={rank} and {size_name}={world_size} do not form a world: expected "
                          f"{size_name} >= 1 and 0 <= {rank_name} < {size_name}")


def this_host_names() -> set:
    """Names this host answers to (short and full host name), for finding it in a host list."""
    names = {socket.gethostname(), os.uname().nodename}
    names |= {n.split(".")[0] for n in names}
    return names


def check_visible_gpus(environ: Mapping, world: World, gpus: int) -> None:
    """A rank whose local rank names a GPU it cannot see (``--gpus-per-task`` hides the others)."""
    if not gpus or world.spawn or world.local_rank < gpus:
        return
    hint = (f"SLURM_GPUS_PER_TASK={environ['SLURM_GPUS_PER_TASK']} (--gpus-per-task) gives each task only its own "
            f"GPU(s); ask for --gpus-per-node=<n> with --ntasks-per-node=<n> instead (every task then sees all GPUs "
            f"of its node), or add --gpu-bind=none" if environ.get("SLURM_GPUS_PER_TASK") else
            "make every process of a node see all of the node's GPUs (CUDA_VISIBLE_DEVICES), or start no more "
            "processes per node than it has GPUs")
    raise LaunchError(
        f"local rank {world.local_rank} would use cuda:{world.local_rank} but this process sees {gpus} GPU(s) "
        f"(CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}): {hint}")
