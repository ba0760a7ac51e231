"""torchrun (and the torchstage local launcher, which sets the same variables)."""
from typing import Mapping

from torchstage.launch.environments.base import LauncherEnvironment, LaunchError, check_place, int_var, int_var_or
from torchstage.launch.world import World


class TorchrunEnvironment(LauncherEnvironment):
    """``torchrun --nproc-per-node N script.py``: RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR/PORT."""

    name = "torchrun"
    command = "torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:PORT train.py"
    variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")

    def applies(self, environ: Mapping) -> bool:
        return "RANK" in environ and "WORLD_SIZE" in environ

    def ranks(self, environ: Mapping) -> int:
        return int_var(environ, "WORLD_SIZE")

    def job_id(self, environ: Mapping):
        """The run id (``--rdzv-id``; a fresh one per ``--standalone`` run), kept by restarts; else the master."""
        if environ.get("TORCHELASTIC_RUN_ID", "none") not in ("", "none"):
            return environ["TORCHELASTIC_RUN_ID"]
        return f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}" if environ.get("MASTER_PORT") else None

    def place(self, environ: Mapping, local_devices: int) -> World:
        rank, world_size = int_var(environ, "RANK"), int_var(environ, "WORLD_SIZE")
        check_place(rank, world_size, "RANK", "WORLD_SIZE")
        local_rank = int_var(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else rank
        if world_size > 1 and ("MASTER_ADDR" not in environ or "MASTER_PORT" not in environ):
            raise LaunchError(f"RANK={rank} and WORLD_SIZE={world_size} are set but MASTER_ADDR/MASTER_PORT are "
                              f"not; set both (torchrun does) so the processes can meet")
        return World(rank=rank, world_size=world_size, local_rank=local_rank,
                     master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
                     master_port=parse_port(environ.get("MASTER_PORT"), "MASTER_PORT"), source=self.name,
                     node_rank=int_var_or(environ, "GROUP_RANK", 0),
                     local_size=int_var_or(environ, "LOCAL_WORLD_SIZE", None),
                     nnodes=int_var_or(environ, "GROUP_WORLD_SIZE", None))


def parse_port(value, name):
    """A TCP port from an argument or variable; None when not given."""
    if value is None or value == "":
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise LaunchError(f"{name} must be a TCP port number 1-65535, got {value!r}")
    return port
