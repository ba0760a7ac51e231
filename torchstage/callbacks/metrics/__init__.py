"""Metric callbacks: per-batch updates of accumulators, loader-level averages and aggregations, exact across
ranks."""
