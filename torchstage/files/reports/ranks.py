"""The ranks of one run side by side, for ``torchstage report``: each rank's step times per epoch (who was slow,
when), the straggler episodes and what they cost, as Markdown and a figure; and the episodes as text lines for
``torchstage diagnose``. Read from the files the straggler detector writes (:mod:`torchstage.files.straggler_log`).
"""
import datetime
import os
import re
import statistics

from torchstage.files.straggler_log import EPISODES_FILE, episodes, read_events, read_rank_figures, read_ranks

PARTS = ("compute", "data", "wait")


def has_rank_figures(logdir) -> bool:
    """Whether the run wrote per-rank figures or straggler findings (a run of several processes with a logdir)."""
    return bool(read_rank_figures(logdir)) or os.path.exists(os.path.join(logdir, EPISODES_FILE))


def per_rank(logdir) -> dict:
    """Rank -> part -> [(global epoch, ms per batch)] over the run's train loaders (the first loader's, where a stage
    has several): each rank's time per batch epoch by epoch."""
    found = {}
    for loader, rows in read_rank_figures(logdir).items():
        for row in rows:
            for key, value in row.items():
                match = re.fullmatch(r"rank(\d+)/(compute|data|wait)_ms", key)
                if match:
                    found.setdefault(int(match[1]), {}).setdefault(match[2], []).append((row["step"], value))
    return found


def episode_rows(logdir) -> list:
    """Each straggler episode with its span and cost: rank, host, local rank, part, its findings (``start``: the slow
    one, ``end``: the recovered or ended one, None if the file stops before), when it ``began`` and ``stopped``
    (``(time, {stage, epoch, global_batch_step})``: where it was first slow, and first back at speed, or the run's
    end), the seconds between, the largest share of the job's time it cost, and the seconds lost: its excess over
    the median per batch (the mean of its findings') times the train batches between, which every rank waited."""
    rows = []
    for episode in episodes(read_events(logdir)):
        start, end = episode["start"], episode["end"]
        began = (start.get("began", start["time"]), start.get("began_at") or _at(start))
        last = end or (episode["updates"][-1] if episode["updates"] else start)
        stopped = (last.get("began", last["time"]), last.get("began_at") or _at(last)) \
            if end is not None and end["kind"] == "recovered" else (last["time"], _at(last))
        seconds = max(0.0, stopped[0] - began[0])
        findings = [start] + episode["updates"]
        excess = statistics.mean(e["value_ms"] - e["median_ms"] for e in findings) / 1e3  # seconds per batch
        batches = (stopped[1].get("global_batch_step") or 0) - (began[1].get("global_batch_step") or 0)
        lost = batches * excess if batches > 0 else seconds * statistics.mean(e["share"] for e in findings)
        rows.append({"rank": episode["rank"], "host": start.get("host", "?"), "local_rank": start.get("local_rank", "?"),
                     "part": episode["part"], "start": start, "end": end, "began": began, "stopped": stopped,
                     "seconds": seconds, "worst": episode["worst"], "lost": lost,
                     "recovered": end is not None and end["kind"] == "recovered"})
    return rows


def _at(event: dict) -> dict:
    return {key: event.get(key) for key in ("stage", "epoch", "global_batch_step")}


def describe_episode(row: dict) -> str:
    """One line of ``torchstage diagnose`` for an episode."""
    (began, at), (stopped, until) = row["began"], row["stopped"]
    start = row["start"]
    span = f"from {_clock(began)} (stage {at.get('stage')!r}, epoch {at.get('epoch')}, global batch " \
           f"{at.get('global_batch_step')})"
    if row["end"] is None:
        how = f"to {_clock(stopped)} at least (the findings stop there, before a recovery or the run's end)"
    else:
        verb = "recovered" if row["recovered"] else "still slow when the run ended"
        how = f"to {_clock(stopped)} (epoch {until.get('epoch')}, global batch {until.get('global_batch_step')}), {verb}"
    return (f"rank {row['rank']} (host {row['host']}, local rank {row['local_rank']}) slow in {row['part']} {span} "
            f"{how}: {start['value_ms']:.1f} ms per batch against a median of {start['median_ms']:.1f} ms when "
            f"named, at worst {row['worst']:.0%} of the job's time; about {row['lost']:.1f} s of it lost over "
            f"{row['seconds']:.1f} s")


def diagnose_lines(logdir) -> list:
    """The straggler part of ``torchstage diagnose``: its episodes, or that none was named; None when the run wrote
    no straggler files (one process, or no logdir)."""
    if not has_rank_figures(logdir) and not os.path.exists(os.path.join(logdir, "logs", "ranks.json")):
        return None
    rows = episode_rows(logdir)
    path = os.path.join(logdir, EPISODES_FILE)
    if not rows:
        return [f"no straggler was named in this run ({path}: no episode)"]
    return [f"straggler episodes in {path}: {len(rows)}"] + [f"  {describe_episode(row)}" for row in rows]


def markdown(logdir, figure: str = None) -> list:
    """The Markdown lines of one run's ranks: a table of each rank's median times per batch over the epochs (and
    its worst epoch against the other ranks), then the episodes."""
    ranks, places, rows = per_rank(logdir), read_ranks(logdir), episode_rows(logdir)
    lines = [f"## Ranks of `{logdir}`", ""]
    if ranks:
        lines += ["Milliseconds per train batch, the median over the epochs; *worst epoch*: the epoch where the rank's "
                  "compute or data time was furthest above the median of the other ranks', as a share of the time "
                  "per batch (what the job lost to it: every rank waits for the slowest).", "",
                  "| rank | host | local rank | compute (ms) | data (ms) | wait (ms) | worst epoch | episodes | "
                  "time lost (s) |", "|---:|---|---:|---:|---:|---:|---|---:|---:|"]
        for rank in sorted(ranks):
            place = places.get(rank, {})
            medians = {part: statistics.median(v for _, v in ranks[rank].get(part, [(0, 0.0)])) for part in PARTS}
            mine = [row for row in rows if row["rank"] == rank]
            lines.append(f"| {rank} | {place.get('host', '?')} | {place.get('local_rank', '?')} | "
                         f"{medians['compute']:.2f} | {medians['data']:.2f} | {medians['wait']:.2f} | "
                         f"{_worst_epoch(ranks, rank)} | {len(mine)} | {sum(r['lost'] for r in mine):.1f} |")
        lines.append("")
    else:
        lines += ["(no per-rank figures: above 64 processes only their summaries reach the logs)", ""]
    if rows:
        lines += ["Straggler episodes:", ""] + [f"- {describe_episode(row)}" for row in rows] + [""]
    else:
        lines += ["No straggler was named.", ""]
    if figure:
        lines += [f"![ranks]({figure})", ""]
    return lines


def _worst_epoch(ranks: dict, rank: int) -> str:
    """The epoch where ``rank`` cost the job most: its compute or data time over the median of the others', as a
    share of the epoch's time per batch (the median over ranks of compute + data + wait)."""
    worst = (0.0, None, None)
    epochs = sorted({e for r in ranks.values() for points in r.values() for e, _ in points})
    for epoch in epochs:
        step = statistics.median(sum(v for part in PARTS for e, v in ranks[r].get(part, []) if e == epoch)
                                 for r in ranks)
        for part in ("compute", "data"):
            mine = [v for e, v in ranks[rank].get(part, []) if e == epoch]
            others = [v for r in ranks if r != rank for e, v in ranks[r].get(part, []) if e == epoch]
            if mine and others and step > 0:
                share = (mine[0] - statistics.median(others)) / step
                if share > worst[0]:
                    worst = (share, epoch, part)
    return f"{worst[1]} ({worst[2]}, {worst[0]:.0%} of the step)" if worst[1] is not None else "-"


def plot(logdir, output: str) -> str:
    """Compute and data time per batch of every rank, epoch by epoch (one line per rank), the straggler episodes
    shaded on the epochs they spanned; written to ``output``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # optional extra, as for torchstage plot
    from matplotlib.figure import Figure
    ranks, rows = per_rank(logdir), episode_rows(logdir)
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(f"Time per train batch of each rank: {logdir}")
    for index, part in enumerate(("compute", "data")):
        axes = figure.add_subplot(1, 2, index + 1)
        for rank in sorted(ranks):
            points = ranks[rank].get(part, [])
            if points:
                axes.plot(*zip(*points), marker="o", markersize=3, label=f"rank {rank}")
        for row in rows:
            if row["part"] == part:
                first = row["began"][1].get("epoch") or 1
                last = row["stopped"][1].get("epoch") or first
                axes.axvspan(first - 0.5, last + 0.5, color="tab:red", alpha=0.12)
        axes.set_title(f"{part} (ms per batch; straggler episodes shaded)")
        axes.set_xlabel("epoch")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        if len(ranks) <= 16:
            axes.legend(fontsize="small", ncol=2)
    figure.savefig(output, dpi=100)
    return output


def _clock(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")
