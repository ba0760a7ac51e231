"""SLURM layouts that would hang or silently use part of the allocation, caught before any collective.

Each check raises :class:`~torchstage.launch.slurm.step.SlurmConfigError` saying what it found and the fix.
"""
from typing import Mapping

from torchstage.launch.slurm import step as slurm


def check_not_batch_script(environ: Mapping) -> None:
    """An sbatch script of several tasks that runs ``python train.py`` without srun trains alone: refuse."""
    if environ.get("ENVIRONMENT") != "BATCH" or not environ.get("SLURM_JOB_ID"):
        return
    ntasks = environ.get("SLURM_NTASKS", "")
    if ntasks.isdigit() and int(ntasks) > 1:
        raise slurm.SlurmConfigError(
            f"this process runs in the batch script of SLURM job {environ['SLURM_JOB_ID']} (ENVIRONMENT=BATCH), "
            f"whose allocation has SLURM_NTASKS={ntasks} tasks, but srun did not start it: it would train alone on "
            f"the first node while the other tasks' resources sit idle. Start it with 'srun python ...' in the "
            f"script ('torchstage slurm' writes that line), or ask for --ntasks=1 to train in one process")


def _elastic_world(environ: Mapping, world_size: int, per_task: int, step) -> bool:
    """An elastic torchrun world (``--nnodes=MIN:MAX``) of other nodes than the step's tasks: nodes of other steps
    joined it (it is larger), or, re-formed after a failure (a restart count), nodes of this step were lost. On a
    first attempt a smaller world is the separate worlds of torchruns that did not meet: refused."""
    nodes = environ.get("GROUP_WORLD_SIZE", "")
    if not nodes.isdigit() or world_size != int(nodes) * per_task:
        return False
    restarted = environ.get("TORCHELASTIC_RESTART_COUNT", "0").strip()
    return int(nodes) > step.ntasks or (int(nodes) < step.ntasks and restarted.isdigit() and int(restarted) > 0)


def check_second_launcher(environ: Mapping, launcher: str, rank: int, world_size: int,
                          step: slurm.SlurmStep) -> str:
    """A launcher (torchrun, mpirun) inside an srun step: allow the forms that make one world, refuse the rest.

    Supported: ``srun --ntasks-per-node=1 torchrun --nnodes=N ...`` (torchrun's world is the step's tasks times
    its local processes) and ``mpirun`` in an allocation (its daemons are the one-per-node step tasks). Returns
    "ignore-slurm" when the launcher's variables describe the world, "slurm" when they agree with SLURM's.
    """
    if launcher == "torchrun" and environ.get("TORCHSTAGE_LAUNCHED"):
        return "ignore-slurm"  # our own workers spawned by a one-task-per-node step
    if (rank, world_size) == (step.procid, step.ntasks):
        return "slurm"  # srun --mpi=pmi2/pmix starting the ranks itself: both say the same
    local = environ.get("LOCAL_WORLD_SIZE") if launcher == "torchrun" else None
    per_task = int(local) if local and local.isdigit() else None
    one_per_node = all(t == 1 for t in step.tasks_per_node)
    if launcher == "torchrun" and (per_task is None or world_size == step.ntasks * per_task and one_per_node):
        return "ignore-slurm"  # without LOCAL_WORLD_SIZE (variables set by hand) there is nothing to compare
    if launcher == "torchrun" and one_per_node and _elastic_world(environ, world_size, per_task, step):
        return "ignore-slurm"
    if launcher != "torchrun" and one_per_node and world_size > step.ntasks:
        return "ignore-slurm"
    tpn = ",".join(map(str, step.tasks_per_node))
    fix = ("use 'srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node=<devices> "
           "--rdzv-backend=c10d --rdzv-endpoint=<first host>:<port> train.py', or plain 'srun python train.py' "
           "without torchrun" if launcher == "torchrun" else
           "run 'mpirun python train.py' in the batch script without srun, or 'srun python train.py' without mpirun")
    raise slurm.SlurmConfigError(
        f"srun started {step.ntasks} task(s) (SLURM_STEP_TASKS_PER_NODE={tpn}) and inside them {launcher} started "
        f"a world of {world_size} (this process: rank {rank}): the two launchers would make "
        f"worlds that do not match (separate, doubled or half-formed) and wait for each other forever. Use one "
        f"launcher: {fix}")
