"""CSV files under ``logdir/logs/``: ``<loader>.csv`` one row per epoch (every stage in one file), batch and
mid-epoch validation rows in ``batch/<loader>.csv`` and ``periodic/<loader>.csv``, and ``hparams.json``."""
import csv
import io
import json
import os

from torchstage.callbacks.loggers.logger_base import EPOCH, LoggerCallback
from torchstage.files.log_files import LogFiles


class CSVLogger(LoggerCallback):
    """Epoch files get a row appended per epoch and are rewritten atomically when a new column appears; every
    file is cut back to the rows a checkpoint counted when a resumed run first writes it, so a resumed run
    never repeats a step. Checkpoints hold row counts, not rows: their size does not grow with the epochs.
    The writes go through the run's file writer thread, in order, before the checkpoint that counts them."""

    name = "csv"

    def __init__(self, logdir: str = None, log_period=None):
        super().__init__(log_period)
        self.logdir, self.epoch_rows, self.appended = logdir, {}, {}  # file -> rows written (kept on resume)
        self._columns = {}  # batch file -> its header, once this process has opened it
        self._epoch = {}  # loader -> (columns, rows) of its epoch file as this process wrote it
        self._files = LogFiles()

    def folder(self, runner) -> str:
        return os.path.join(self.logdir or runner.spec.logdir, "logs")

    def on_experiment_start(self, runner):
        self._columns, self._epoch = {}, {}  # a run's first write of each file reads it (and cuts it back)
        super().on_experiment_start(runner)

    def log_hparams(self, hparams, runner):
        text = json.dumps(hparams, indent=1, sort_keys=True, default=str)
        self._files.replace(runner, os.path.join(self.folder(runner), "hparams.json"), text.encode())

    def log_metrics(self, metrics, step, loader, scope, runner):
        if scope == EPOCH:
            self._epoch_row(runner, loader, metrics)
        else:
            self._append(runner, os.path.join(scope, f"{loader}.csv"),
                         {"step": step, "stage": runner.loop.stage_key, "epoch": runner.loop.epoch, **metrics})

    def _epoch_row(self, runner, loader, metrics):
        loop = runner.loop
        row = {"stage": loop.stage_key, "epoch": loop.epoch, "global_epoch": loop.global_epoch_step, **metrics}
        path = os.path.join(self.folder(runner), f"{loader}.csv")
        columns, rows = self._epoch.get(loader, (None, None))
        if columns is not None and columns.keys() >= row.keys():  # same columns as the file this process wrote
            rows.append(row)
            self._files.append(runner, path, _csv_text(columns, [row]))
        else:  # the first row of this process (after the rows a checkpoint counted) or a new column: rewrite
            rows = (_read_rows(path, self.epoch_rows.get(loader, 0)) if rows is None else rows) + [row]
            columns = dict.fromkeys(key for r in rows for key in r)
            self._files.replace(runner, path, _csv_text(columns, rows, header=True))
            self._epoch[loader] = (columns, rows)
        self.epoch_rows[loader] = len(rows)

    def _append(self, runner, name, row):
        path = os.path.join(self.folder(runner), name)
        if name not in self._columns:  # first write of this process: keep the header and the checkpoint's rows
            keep = self.appended.get(name, 0)
            lines = open(path).read().splitlines(keepends=True)[:keep + 1] if keep and os.path.exists(path) else []
            self._files.replace(runner, path, "".join(lines or [",".join(row) + "\n"]).encode())
            self.appended[name] = len(lines) - 1 if lines else 0
            self._columns[name] = dict.fromkeys((lines[0] if lines else ",".join(row)).rstrip("\n").split(","))
        self._files.append(runner, path, _csv_text(self._columns[name], [row]))
        self.appended[name] += 1

    def close(self, runner, status):
        self._files.close(runner)

    def state_dict(self):
        return {"epoch_rows": dict(self.epoch_rows), "appended": dict(self.appended)}

    def load_state_dict(self, state):
        rows = state.get("rows")  # older checkpoints held the rows themselves
        self.epoch_rows = {k: len(v) for k, v in rows.items()} if rows is not None else dict(state["epoch_rows"])
        self.appended = dict(state.get("appended", {}))
        self._columns, self._epoch = {}, {}  # the next write of each file cuts it back to the counted rows


def _csv_text(columns: dict, rows: list, header: bool = False) -> bytes:
    """``rows`` as CSV lines under ``columns`` (values of other keys left out), with the header line first."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode()


def _read_rows(path: str, keep=None) -> list:
    """The rows of the CSV file at ``path`` (the first ``keep`` of them; all for None); none if it is missing."""
    if keep == 0 or not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows if keep is None else rows[:keep]
