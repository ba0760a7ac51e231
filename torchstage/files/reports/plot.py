"""Training curves from a run's CSV logs (``logdir/logs/<loader>.csv``) as one PNG: a panel per metric."""
import csv
import glob
import math
import os

#: Columns CSVLogger writes besides metrics.
INDEX_COLUMNS = ("stage", "epoch", "global_epoch")


def read_logs(logdir: str) -> dict:
    """Loader -> rows (dicts with ``stage``, ``epoch``, ``global_epoch`` and float metrics)."""
    files = sorted(glob.glob(os.path.join(logdir, "logs", "*.csv")))
    if not files:
        raise FileNotFoundError(f"no CSV logs in {os.path.join(logdir, 'logs')!r}: expected <loader>.csv files "
                                f"written by a run with logdir={logdir!r}")
    logs = {}
    for path in files:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        logs[os.path.splitext(os.path.basename(path))[0]] = [_parse_row(row) for row in rows]
    return logs


def _parse_row(row: dict) -> dict:
    parsed = {"stage": row.get("stage", ""), "epoch": int(row["epoch"]), "global_epoch": int(row["global_epoch"])}
    for key, value in row.items():
        if key in INDEX_COLUMNS or value in (None, ""):
            continue
        try:
            parsed[key] = float(value)
        except ValueError:
            pass  # a non-numeric column: nothing to draw
    return parsed


def plot_logs(logdir: str, output: str = None) -> str:
    """Draw every logged metric per loader against the global epoch; stage changes are dashed lines.

    Writes ``output`` (default ``logdir/curves.png``) and returns its path. Needs matplotlib
    (``pip install torchstage[plot]``).
    """
    try:
        # imported here: matplotlib is an optional extra
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise ImportError("torchstage plot needs matplotlib, which is not installed: "
                          "pip install 'torchstage[plot]'") from exc
    logs = read_logs(logdir)
    metrics = list(dict.fromkeys(k for rows in logs.values() for row in rows for k in row if k not in INDEX_COLUMNS))
    if not metrics:
        raise ValueError(f"the logs in {os.path.join(logdir, 'logs')!r} hold no numeric metric to plot")
    columns = min(3, len(metrics))
    rows_n = math.ceil(len(metrics) / columns)
    figure = Figure(figsize=(4.5 * columns, 3.2 * rows_n), layout="constrained")
    FigureCanvasAgg(figure)
    stage_starts = _stage_starts(logs)
    for index, metric in enumerate(metrics):
        axes = figure.add_subplot(rows_n, columns, index + 1)
        for loader, rows in logs.items():
            points = [(row["global_epoch"], row[metric]) for row in rows if metric in row]
            if points:
                xs, ys = zip(*points)
                axes.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=loader)
        for epoch in stage_starts:
            axes.axvline(epoch - 0.5, color="grey", linestyle="--", linewidth=0.8)
        axes.set_title(metric)
        axes.set_xlabel("epoch")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    output = output or os.path.join(logdir, "curves.png")
    figure.savefig(output, dpi=100)
    return output


def _stage_starts(logs: dict) -> list:
    """Global epochs at which a new stage begins (after the first)."""
    starts, previous = set(), None
    for rows in logs.values():
        previous = None
        for row in sorted(rows, key=lambda r: r["global_epoch"]):
            if previous is not None and row["stage"] != previous:
                starts.add(row["global_epoch"])
            previous = row["stage"]
    return sorted(starts)
