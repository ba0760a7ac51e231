"""The pre-flight check: before a long job, every rank's matmul and host-memory speed and the links between them,
compared across the world; the ranks (and nodes) well below the others are named (``torchstage preflight``,
``train(preflight=True)``)."""
