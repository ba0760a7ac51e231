"""Strategies: how a model trains across processes (an abstract Strategy; single device, DDP, FSDP, DeepSpeed)."""
