"""Every feature of a run is a callback; the user-facing ones are exported from ``torchstage``."""
