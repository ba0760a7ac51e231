"""Measuring a run: throughput, data wait, memory and MFU, FLOPs, the profiler, timers and the model summary."""
