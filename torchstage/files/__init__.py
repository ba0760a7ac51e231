"""What a run writes and reads back: the checkpoint format (atomic writes, checksums, safe loading), sharded
checkpoints, the file writer thread, log files, the logdir lock, and the plots and reports read from a logdir."""
