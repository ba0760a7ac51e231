"""Who this process is and how the ranks talk: the immutable Engine (rank, world, place in the device mesh, the
collectives), the layout arithmetic of the mesh, the run's agreement channel and the hang watchdogs' board. Below
strategies, data, files and metrics; it knows nothing of runners, callbacks or strategies."""
