"""How processes start and find each other: launcher environments, resolving and entering the world, the local
launcher, and SLURM's tools."""
