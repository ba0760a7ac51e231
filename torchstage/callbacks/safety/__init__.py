"""Keeping a run alive or ending it cleanly: the hang watchdog and its report, the even-batches check, graceful
stops and SLURM requeue."""
