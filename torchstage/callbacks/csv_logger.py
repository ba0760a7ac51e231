"""Per-loader CSV files ``logdir/logs/<loader>.csv``: one row per epoch, every stage in one file."""
import csv
import io
import os

from torchstage.callbacks.base import Callback, CallbackOrder, CallbackScope
from torchstage.checkpoint import write_atomic


class CSVLogger(Callback):
    """Writes the loader metrics of each epoch; the file is rewritten atomically so new columns can appear."""

    order = CallbackOrder.Logging
    scope = CallbackScope.Main
    name = "csv"

    def __init__(self, logdir: str = None):
        self.logdir, self.rows = logdir, {}

    def on_loader_end(self, runner):
        row = {"stage": runner.stage_key, "epoch": runner.epoch, "global_epoch": runner.global_epoch_step,
               **runner.loader_metrics}
        rows = self.rows.setdefault(runner.loader_key, [])
        rows.append(row)
        columns = list(dict.fromkeys(key for r in rows for key in r))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        folder = os.path.join(self.logdir or runner.spec.logdir, "logs")
        write_atomic(os.path.join(folder, f"{runner.loader_key}.csv"), text.getvalue().encode())

    def state_dict(self):
        return {"rows": self.rows}

    def load_state_dict(self, state):
        self.rows = {k: list(v) for k, v in state["rows"].items()}
