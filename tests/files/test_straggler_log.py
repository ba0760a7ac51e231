"""The straggler detector's files read back: findings grouped into episodes per rank, part and attempt (a line cut
short by a crash is skipped), the ranks' places, and the per-rank CSV figures."""
import json

from tests.helpers import straggler_logdir
from torchstage.files.straggler_log import (EPISODES_FILE, episodes, event_line, ranks_text, read_events,
                                            read_rank_figures, read_ranks)


def finding(kind, rank=1, part="compute", attempt=0, share=0.3, worst=0.3):
    return {"kind": kind, "rank": rank, "part": part, "attempt": attempt, "share": share, "worst": worst}


def test_findings_pair_into_episodes_and_a_broken_line_is_skipped(tmp_path):
    (tmp_path / "logs").mkdir()
    lines = [finding("slow"), finding("slow", rank=2, part="data"), finding("worse", share=0.5, worst=0.5),
             finding("recovered", share=0.0, worst=0.5), finding("slow", attempt=1), finding("ended", attempt=1)]
    text = b"".join(event_line(line) for line in lines) + b'{"kind": "slow", "rank"'  # a crash mid-write
    (tmp_path / EPISODES_FILE).write_bytes(text)
    found = episodes(read_events(tmp_path))
    assert [(e["rank"], e["part"], e["start"]["attempt"], e["end"] and e["end"]["kind"]) for e in found] == \
        [(1, "compute", 0, "recovered"), (2, "data", 0, None), (1, "compute", 1, "ended")]
    assert len(found[0]["updates"]) == 1 and found[0]["worst"] == 0.5
    assert episodes(read_events(tmp_path / "nowhere")) == []


def test_places_and_per_rank_figures_read_back(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "ranks.json").write_bytes(ranks_text([("a", 0), ("b", 1)]))
    assert read_ranks(tmp_path) == {0: {"host": "a", "local_rank": 0}, 1: {"host": "b", "local_rank": 1}}
    logdir = straggler_logdir(tmp_path / "run")
    figures = read_rank_figures(logdir)
    assert list(figures) == ["train"] and [row["epoch"] for row in figures["train"]] == [1, 2, 3, 4, 5]
    assert figures["train"][1]["rank2/compute_ms"] == 30.0 and figures["train"][0]["step"] == 1
    assert json.loads(ranks_text([("h", 3)]))["ranks"] == [{"rank": 0, "host": "h", "local_rank": 3}]
