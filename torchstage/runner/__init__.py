"""The loop: Runner, SupervisedRunner and the checked arguments of ``train``."""
