"""Checkpoint files of a run: last, best and top-k, the config copy, and stateful loaders' positions."""
