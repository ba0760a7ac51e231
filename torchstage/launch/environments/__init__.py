"""One small object per launcher (torchrun, SLURM, OpenMPI, MPICH hydra, PBS/PALS, LSF/jsrun).

Each says whether it started this process and where the process sits; the order in which they are
asked is :data:`torchstage.launch.resolve.ENVIRONMENTS`.
"""
