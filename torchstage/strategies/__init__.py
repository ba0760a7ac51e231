"""Strategies: what differs between one process, DDP and FSDP (placement, wrapping, sync, clipping, state)."""
