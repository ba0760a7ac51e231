"""A module of start_state.py's own folder: it draws a number when imported (a rank imports it again)."""
import torch

DRAW = torch.rand(1).item()
