"""What every launcher environment answers: does it apply, and where does this process sit."""
import os
import socket
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple


class LaunchError(ValueError):
    """Launcher variables (or their absence) that cannot give a working distributed run."""


@dataclass(frozen=True)
class Place:
    """This process's place in the world a launcher started (``spawn > 0``: start that many locally)."""

    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    master_addr: str
    master_port: Optional[int]
    spawn: int = 0


class LauncherEnvironment:
    """One launcher: ``applies`` says whether it started this process, ``place`` where it sits.

    ``name`` becomes ``World.source``; ``variables`` are the names ``torchstage env`` shows.
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

    def place(self, environ: Mapping, local_devices: int) -> Place:
        raise NotImplementedError


def int_var(environ: Mapping, name: str) -> int:
    """``environ[name]`` as an int, or LaunchError naming the variable and its value."""
    try:
        return int(environ[name])
    except KeyError:
        raise LaunchError(f"environment variable {name} is not set") from None
    except ValueError:
        raise LaunchError(f"environment variable {name} must be an integer, got {environ[name]!r}") from None


def check_place(rank: int, world_size: int, rank_name: str, size_name: str) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise LaunchError(f"{rank_name}={rank} and {size_name}={world_size} do not form a world: expected "
                          f"{size_name} >= 1 and 0 <= {rank_name} < {size_name}")


def this_host_names() -> set:
    """Names this host answers to (short and full host name), for finding it in a host list."""
    names = {socket.gethostname(), os.uname().nodename}
    names |= {n.split(".")[0] for n in names}
    return names
