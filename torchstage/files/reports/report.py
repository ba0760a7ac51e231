"""A scalability report from runs of one script at several world sizes: a Markdown table and a PNG figure; and for
each run of several processes, its ranks side by side (:mod:`~torchstage.files.reports.ranks`).

The scalability table needs runs trained with ``train(monitor=True)`` (``time_s``, ``samples_per_s`` and
``data_wait`` in its CSV logs). The first epoch is left out when a run has several (it holds warm-up:
allocations, FLOP counting, loader workers starting).
"""
import json
import os

from torchstage.files.checkpoint_read import load_checkpoint
from torchstage.files.reports import ranks
from torchstage.files.reports.plot import read_logs

#: Table columns: (key, header, format).
COLUMNS = (("world_size", "world size", "{:d}"), ("epoch_time", "epoch time (s)", "{:.3f}"),
           ("throughput", "train samples/s", "{:.1f}"), ("speedup", "speedup", "{:.2f}"),
           ("efficiency", "efficiency", "{:.0%}"), ("data_wait", "data wait", "{:.1%}"),
           ("peak_memory_mb", "peak memory (MB)", "{:.0f}"), ("threads", "threads/process", "{}"),
           ("epochs", "epochs averaged", "{:d}"))


def run_figures(logdir: str) -> dict:
    """The averaged figures of one run: world size, epoch time, train throughput, data wait, peak memory."""
    logs = read_logs(logdir)
    train = [row for row in logs.get("train", []) if "time_s" in row]
    if not train:
        raise ValueError(f"{logdir!r} has no throughput figures in logs/train.csv; run it with "
                         f"train(monitor=True) (or a ThroughputMonitor callback)")
    epochs = sorted({row["global_epoch"] for row in train})
    epochs = epochs[1:] if len(epochs) > 1 else epochs
    times = {e: sum(row["time_s"] for rows in logs.values() for row in rows
                    if row["global_epoch"] == e and "time_s" in row) for e in epochs}
    steady = [row for row in train if row["global_epoch"] in epochs]
    return {"logdir": logdir, "world_size": _world_size(logdir), "threads": _threads(logdir), "epochs": len(epochs),
            "epoch_time": sum(times.values()) / len(times),
            "throughput": sum(r["samples_per_s"] for r in steady) / len(steady),
            "data_wait": sum(r["data_wait"] for r in steady) / len(steady),
            "peak_memory_mb": max(r.get("peak_memory_mb", 0.0) for r in steady)}


def _world_size(logdir: str) -> int:
    path = os.path.join(logdir, "logs", "hparams.json")
    if os.path.exists(path):
        return int(json.load(open(path))["world_size"])
    return int(load_checkpoint(os.path.join(logdir, "checkpoints", "last.pth"))["meta"]["world_size"])


def _threads(logdir: str):
    """The torch threads of each process of the run (``hparams.json``), or "?" for a run that did not record them."""
    path = os.path.join(logdir, "logs", "hparams.json")
    if os.path.exists(path):
        return json.load(open(path)).get("threads_per_process", "?")
    return "?"


def unlike(rows: list):
    """What makes the runs unlike, so that speedup and efficiency would mislead; None when they compare like with
    like (threads per process: a process with more CPU threads is not one rank's worth of a machine)."""
    threads = {row["world_size"]: row["threads"] for row in rows}
    if len(set(threads.values())) <= 1:
        return None
    each = ", ".join(f"world size {size}: {count}" for size, count in threads.items())
    return (f"the runs differ in torch threads per process ({each}), so speedup and efficiency compare unlike "
            f"runs; run each with the same OMP_NUM_THREADS (torchstage's launcher sets cores / processes for its "
            f"workers; set it for the single process too, e.g. OMP_NUM_THREADS=1)")


def scaling_table(logdirs) -> list:
    """One row per run, by world size; speedup and efficiency relative to the smallest world size."""
    rows = sorted((run_figures(d) for d in logdirs), key=lambda r: r["world_size"])
    base = rows[0]
    for row in rows:
        row["speedup"] = base["epoch_time"] / row["epoch_time"]
        row["efficiency"] = row["speedup"] * base["world_size"] / row["world_size"]
    return rows


def markdown(rows: list, figure: str = None) -> str:
    lines = ["# Scalability report", "",
             f"Speedup and efficiency are relative to world size {rows[0]['world_size']} (epoch time); "
             "figures are averages over each run's epochs, the first left out when there are several.", ""]
    caveat = unlike(rows)
    if caveat:
        lines += [f"**Not like with like:** {caveat}.", ""]
    lines += [
             "| " + " | ".join(h for _, h, _ in COLUMNS) + " | run |",
             "|" + "---:|" * len(COLUMNS) + "---|"]
    for row in rows:
        lines.append("| " + " | ".join(f.format(row[k]) for k, _, f in COLUMNS) + f" | `{row['logdir']}` |")
    if figure:
        lines += ["", f"![scalability]({figure})"]
    return "\n".join(lines) + "\n"


def plot(rows: list, output: str) -> str:
    """Six panels against world size: epoch time, throughput, speedup, efficiency, data wait, memory."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # optional extra, as for torchstage plot
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter
    sizes = [r["world_size"] for r in rows]
    base = rows[0]
    figure = Figure(figsize=(13, 7), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(f"Scalability over {len(rows)} runs (baseline: world size {base['world_size']})")
    ideal = [s / base["world_size"] for s in sizes]
    panels = (("epoch time (s)", "epoch_time", [base["epoch_time"] / i for i in ideal], None),
              ("train throughput (samples/s)", "throughput", [base["throughput"] * i for i in ideal], None),
              ("speedup", "speedup", ideal, None), ("efficiency", "efficiency", [1.0] * len(rows), 1),
              ("data-loader wait (share of step time)", "data_wait", None, 1),
              ("peak memory, largest rank (MB)", "peak_memory_mb", None, None))
    for index, (title, key, ideal_values, percent) in enumerate(panels):
        axes = figure.add_subplot(2, 3, index + 1)
        values = [r[key] for r in rows]
        labels = [f"{v:.0%}" if percent else f"{v:,.0f}" if v >= 100 else f"{v:.2f}" for v in values]
        if key in ("data_wait", "peak_memory_mb"):
            bars = axes.bar([str(s) for s in sizes], values, color="tab:orange" if key == "data_wait" else "tab:grey")
            axes.bar_label(bars, labels, fontsize="small")
        else:
            axes.plot(sizes, values, marker="o", label="measured")
            for size, value, label in zip(sizes, values, labels):
                axes.annotate(label, (size, value), textcoords="offset points", xytext=(0, 6), ha="center",
                              fontsize="small")
            axes.set_xticks(sizes)
            axes.margins(x=0.15)
            if ideal_values is not None:
                axes.plot(sizes, ideal_values, linestyle="--", color="grey", label="ideal (linear)")
                axes.legend(fontsize="small")
        if percent:
            axes.yaxis.set_major_formatter(PercentFormatter(1.0))
        top = max(values + (ideal_values or [])) * 1.15
        axes.set_ylim(0, max(1.1, top) if percent else top)  # from zero, so gaps are not exaggerated
        axes.set_title(title)
        axes.set_xlabel("world size (processes)")
        axes.grid(alpha=0.3)
    figure.savefig(output, dpi=100)
    return output


def write_report(logdirs, output: str) -> tuple:
    """Write ``output/report.md`` with the scalability table and figure ``output/report.png`` of the runs trained with
    ``monitor=True``, and for each run of several processes its ranks side by side (``ranks-<run>.png``); return the
    paths written and what makes the runs unlike (None when they compare like with like)."""
    logdirs = list(logdirs)
    with_ranks = [d for d in logdirs if ranks.has_rank_figures(d)]
    monitored = [d for d in logdirs if d not in with_ranks or _monitored(d)]
    rows = scaling_table(monitored) if monitored else []  # raises for a run with neither figures
    os.makedirs(output, exist_ok=True)
    paths, lines = [], []
    if rows:
        png = plot(rows, os.path.join(output, "report.png"))
        paths.append(png)
        lines.append(markdown(rows, os.path.basename(png)))
    names = {}
    for logdir in with_ranks:
        name = os.path.basename(os.path.normpath(logdir)) or "run"
        names[name] = names.get(name, 0) + 1
        figure = os.path.join(output, f"ranks-{name}{'' if names[name] == 1 else names[name]}.png")
        if ranks.per_rank(logdir):
            paths.append(ranks.plot(logdir, figure))
        lines.append("\n".join(ranks.markdown(logdir, os.path.basename(figure) if figure in paths else None)))
    md = os.path.join(output, "report.md")
    with open(md, "w") as f:
        f.write("\n".join(lines))
    return (md, *paths, unlike(rows) if rows else None)


def _monitored(logdir) -> bool:
    """Whether a run has the throughput figures of ``train(monitor=True)``."""
    try:
        run_figures(logdir)
    except (ValueError, FileNotFoundError):
        return False
    return True
