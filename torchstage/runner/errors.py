"""Errors of the runner that a user's setup causes (kept under Catalyst 20.12's name, RunnerException)."""


class RunnerException(ValueError):
    """A run that cannot start as given, such as an empty loader; a ValueError, raised before training."""


class LogdirHoldsRun(FileExistsError):
    """The logdir holds what this run cannot start on: another run, or an earlier run's logs without its
    checkpoints. The message gives the fixes in ``train()``'s spelling; ``text(cli=True)`` in ``--set`` options."""

    def __init__(self, problem: str, fixes):
        self.problem, self.fixes = problem, tuple(fixes)  # ((train() spelling, command-line spelling), ...)
        super().__init__(self.text())

    def text(self, cli: bool = False) -> str:
        """The problem and its fixes, as ``train()`` arguments or (``cli``) as ``torchstage run --set`` options."""
        fixes = [line if cli else python for python, line in self.fixes]
        return f"{self.problem}; {', '.join(fixes[:-1])} or {fixes[-1]}" if len(fixes) > 1 else \
            f"{self.problem}; {fixes[0]}"
