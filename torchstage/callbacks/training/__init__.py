"""The training step as callbacks: loop bookkeeping, the loss, non-finite losses, backward and optimizer step
(through the strategy), schedulers and weight averaging."""
