"""CSV files under ``logdir/logs/``: ``<loader>.csv`` one row per epoch (every stage in one file), batch and
mid-epoch validation rows in ``batch/<loader>.csv`` and ``periodic/<loader>.csv``, and ``hparams.json``."""
import csv
import io
import json
import os

from torchstage.callbacks.logger_base import EPOCH, LoggerCallback
from torchstage.checkpoint import write_atomic


class CSVLogger(LoggerCallback):
    """Epoch files get a row appended per epoch, and are rewritten atomically when a new column appears (and at
    a process's first write, from the checkpoint's rows on resume); batch files are appended to and cut back to
    the checkpoint's rows on resume. A resumed run never repeats a step."""

    name = "csv"

    def __init__(self, logdir: str = None, log_period=None):
        super().__init__(log_period)
        self.logdir, self.rows, self.appended = logdir, {}, {}
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
        rows = self.rows.setdefault(loader, [])
        rows.append(row)
        path, columns = os.path.join(self.folder(runner), f"{loader}.csv"), self._epoch_columns.get(loader)
        if columns is not None and columns.keys() >= row.keys():  # same columns as the file this process wrote: append
            with open(path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=list(columns), lineterminator="\n").writerow(row)
            return
        columns = dict.fromkeys(key for r in rows for key in r)  # the first write, or a new column: rewrite
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(path, text.getvalue().encode(), durable=False)
        self._epoch_columns[loader] = columns

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
        return {"rows": self.rows, "appended": dict(self.appended)}

    def load_state_dict(self, state):
        self.rows = {k: list(v) for k, v in state["rows"].items()}
        self.appended = dict(state.get("appended", {}))
