"""How data is split across processes: loaders rebuilt per rank, samplers, loaders built from datasets, prefetch to
the device, and resuming a loader pass mid-epoch."""
