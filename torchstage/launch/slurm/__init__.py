"""SLURM: job steps and their layout, hostlists, the master address and port, checks of layouts that cannot work,
requeue, and sbatch scripts."""
