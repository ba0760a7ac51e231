"""What runs when: validation frequency, mid-epoch validation, early stopping, Optuna pruning, smoke runs and batch
limits."""
