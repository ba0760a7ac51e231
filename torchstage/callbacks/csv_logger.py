"""CSV files under ``logdir/logs/``: ``<loader>.csv`` one row per epoch (every stage in one file), batch and
mid-epoch validation rows in ``batch/<loader>.csv`` and ``periodic/<loader>.csv``, and ``hparams.json``."""
import csv
import io
import json
import os

from torchstage.callbacks.logger_base import EPOCH, LoggerCallback
from torchstage.checkpoint import write_atomic


class CSVLogger(LoggerCallback):
    """Epoch files get a row appended per epoch and are rewritten atomically when a new column appears; every
    file is cut back to the rows a checkpoint counted when a resumed run first writes it, so a resumed run
    never repeats a step. Checkpoints hold row counts, not rows: their size does not grow with the epochs."""

    name = "csv"

    def __init__(self, logdir: str = None, log_period=None):
        super().__init__(log_period)
        self.logdir, self.epoch_rows, self.appended = logdir, {}, {}  # file -> rows written (kept on resume)
        self._columns = {}  # batch file -> its header, once this process has opened it
        self._epoch_columns = {}  # loader -> the columns of its epoch file, once this process has written it

    def folder(self, runner) -> str:
        return os.path.join(self.logdir or runner.spec.logdir, "logs")

    def log_hparams(self, hparams, runner):
        text = json.dumps(hparams, indent=1, sort_keys=True, default=str)
        write_atomic(os.path.join(self.folder(runner), "hparams.json"), text.encode(), durable=False)

    def log_metrics(self, metrics, step, loader, scope, runner):
        if scope == EPOCH:
            self._epoch_row(runner, loader, metrics)
        else:
            self._append(runner, os.path.join(scope, f"{loader}.csv"),
                         {"step": step, "stage": runner.stage_key, "epoch": runner.epoch, **metrics})

    def _epoch_row(self, runner, loader, metrics):
        row = {"stage": runner.stage_key, "epoch": runner.epoch, "global_epoch": runner.global_epoch_step, **metrics}
        path, columns = os.path.join(self.folder(runner), f"{loader}.csv"), self._epoch_columns.get(loader)
        if columns is not None and columns.keys() >= row.keys():  # same columns as the file this process wrote
            with open(path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=list(columns), lineterminator="\n").writerow(row)
        else:  # the first row of this process (after the rows a checkpoint counted) or a new column: rewrite
            keep = self.epoch_rows.get(loader, 0) if columns is None else None
            rows = _read_rows(path, keep) + [row]
            columns = dict.fromkeys(key for r in rows for key in r)
            text = io.StringIO()
            writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
            write_atomic(path, text.getvalue().encode(), durable=False)
            self._epoch_columns[loader] = columns
            self.epoch_rows[loader] = len(rows) - 1
        self.epoch_rows[loader] = self.epoch_rows.get(loader, 0) + 1

    def _append(self, runner, name, row):
        path = os.path.join(self.folder(runner), name)
        if name not in self._columns:  # first write of this process: keep the header and the checkpoint's rows
            keep = self.appended.get(name, 0)
            lines = open(path).read().splitlines(keepends=True)[:keep + 1] if keep and os.path.exists(path) else []
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.writelines(lines or [",".join(row) + "\n"])
            self.appended[name] = len(lines) - 1 if lines else 0
            self._columns[name] = (lines[0] if lines else ",".join(row)).rstrip("\n").split(",")
        with open(path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self._columns[name], extrasaction="ignore", lineterminator="\n").writerow(row)
        self.appended[name] += 1

    def state_dict(self):
        return {"epoch_rows": dict(self.epoch_rows), "appended": dict(self.appended)}

    def load_state_dict(self, state):
        rows = state.get("rows")  # older checkpoints held the rows themselves
        self.epoch_rows = {k: len(v) for k, v in rows.items()} if rows is not None else dict(state["epoch_rows"])
        self.appended = dict(state.get("appended", {}))


def _read_rows(path: str, keep=None) -> list:
    """The rows of the CSV file at ``path`` (the first ``keep`` of them; all for None); none if it is missing."""
    if keep == 0 or not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows if keep is None else rows[:keep]
