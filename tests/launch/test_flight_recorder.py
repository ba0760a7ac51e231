"""Comparing the ranks' recorded collectives (torch's Flight Recorder), and reading dumps without running code."""
import json
import os
import pickle
import sys

from tests import script_server
from tests.helpers import ROOT
from torchstage.launch.failures import explain
from torchstage.launch.flight_recorder import (agreement, compact, differences, first_difference, point_dumps_to,
                                               read_dumps, write_dump)


def entry(seq, op="all_reduce", size=(10,), dtype="Float", site="train.py:5 in step", group="default_pg"):
    return {"group": group, "seq": seq, "p2p": False, "op": op, "sizes": [list(size)], "dtypes": [dtype],
            "site": site}


def test_ranks_that_agree_are_said_to():
    ranks = {r: [entry(1), entry(2)] for r in range(3)}
    assert first_difference(ranks) is None
    assert agreement(ranks) == ("Collectives: the ranks' recorded collectives agree (ranks 0, 1, 2; the last: "
                                "all_reduce(Float[10]) #2 called from train.py:5 in step).")


def test_the_first_collective_of_another_shape_names_each_side():
    ranks = {0: [entry(1), entry(2, size=(1,), site="a.py:3 in f")], 1: [entry(1), entry(2, size=(3,), site="b.py:9 in g")],
             2: [entry(1), entry(2, size=(1,), site="a.py:3 in f")]}
    assert first_difference(ranks) == (
        "First collective where the ranks differ (group 'default_pg', #2): ranks 0, 2 in all_reduce(Float[1]) #2 "
        "called from a.py:3 in f; rank 1 in all_reduce(Float[3]) #2 called from b.py:9 in g.")


def test_a_scatter_whose_inputs_only_its_source_holds_is_no_difference():
    # DTensor's distribute_tensor (tensor parallel plans) scatters from one rank; the others record no input
    ranks = {0: [entry(1, op="scatter", size=(2, 16, 16)), entry(2)], 1: [{**entry(1, op="scatter"), "sizes": []},
                                                                        entry(2)]}
    assert first_difference(ranks) is None
    ranks[1][1] = entry(2, size=(3,))
    assert first_difference(ranks).startswith("First collective where the ranks differ (group 'default_pg', #2)")


def test_a_rank_behind_is_named_with_its_last_collective():
    ranks = {0: [entry(7), entry(8, op="broadcast")], 1: [entry(6), entry(7)]}  # rings that start at other points
    assert first_difference(ranks) == (
        "First collective where the ranks differ (group 'default_pg', #8): rank 0 entered broadcast(Float[10]) #8 "
        "called from train.py:5 in step, which rank 1 never reached; rank 1 last ran all_reduce(Float[10]) #7 called "
        "from train.py:5 in step.")
    assert first_difference({0: [entry(1)]}) is None and first_difference({0: [entry(1)], 1: []}) is None
    assert agreement({0: [entry(1)], 1: []}) is None


def test_dumps_round_trip_and_a_crafted_nccl_dump_runs_no_code(tmp_path):
    assert write_dump(tmp_path, 0, [entry(1)]) == str(tmp_path / "flight-recorder" / "rank-0.json")
    assert write_dump(None, 0, [entry(1)]) is None and write_dump(tmp_path, 1, []) is None
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    (tmp_path / "flight-recorder" / "nccl-rank-1").write_bytes(pickle.dumps({"entries": [Payload()]}))
    nccl = {"entries": [{"process_group": ("0", "default_pg"), "collective_seq_id": 1, "profiling_name": "nccl:all_reduce",
                         "input_sizes": [[10]], "input_dtypes": ["Float"],
                         "frames": [{"filename": "/x/torch/distributed/c10d.py", "line": 1, "name": "all_reduce"},
                                    {"filename": "/job/train.py", "line": 5, "name": "step"}]}]}
    (tmp_path / "flight-recorder" / "nccl-rank-2").write_bytes(pickle.dumps(nccl))
    ranks = read_dumps(tmp_path)
    assert not marker.exists()  # the crafted dump was refused, not run
    assert ranks == {0: [entry(1)], 2: [entry(1, site="/job/train.py:5 in step")]}


def test_nccl_dumps_are_pointed_into_the_logdir_unless_the_user_chose(tmp_path, monkeypatch):
    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    point_dumps_to(tmp_path)
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "flight-recorder" / "nccl-rank-")
    assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/mine/rank_")
    point_dumps_to(tmp_path / "other")
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == "/mine/rank_"


def test_diagnose_without_records_says_where_it_looked(tmp_path):
    result = script_server.run([sys.executable, "-m", "torchstage", "diagnose", str(tmp_path)], env=dict(os.environ),
                               cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert f"no collective records in {tmp_path / 'flight-recorder'}" in result.stderr
    (tmp_path / "flight-recorder").mkdir()
    (tmp_path / "flight-recorder" / "rank-0.json").write_text(json.dumps({"rank": 0, "entries": [entry(1)]}))
    (tmp_path / "flight-recorder" / "rank-1.json").write_text(json.dumps({"rank": 1, "entries": [entry(1)]}))
    result = script_server.run([sys.executable, "-m", "torchstage", "diagnose", str(tmp_path)], env=dict(os.environ),
                               cwd=ROOT, timeout=60)
    assert result.returncode == 0 and "the ranks' recorded collectives agree (ranks 0, 1" in result.stdout


def raw(seq, name, desc="undefined", op="broadcast", size=(4,)):
    """A Flight Recorder entry as torch dumps it (process group: unique name, description)."""
    return {"process_group": (name, desc), "collective_seq_id": seq, "profiling_name": f"gloo:{op}",
            "input_sizes": [list(size)], "input_dtypes": ["Float"],
            "frames": [{"filename": "/job/train.py", "line": 7, "name": "step"}]}


def test_groups_that_share_a_description_and_tails_that_mix_groups_compare_without_error():
    # a DeepSpeed GAN: several groups torch describes as 'undefined', each counting from #1; the failure records
    # keep the last 12 collectives of all groups, so one group's numbers have gaps (issue 48: IndexError)
    history = [raw(seq, "1") for seq in range(1, 13)] + [raw(5, "0", "default_pg"), raw(6, "0", "default_pg"),
                                                         raw(1, "2", op="all_gather", size=(1,))]
    history += [raw(seq, "1", op="all_reduce", size=(4417,)) for seq in (13, 14, 15)]
    tails = {rank: [compact(e) for e in history][-12:] for rank in (0, 1)}
    assert {e["group"] for e in tails[0]} == {"pg 1", "pg 2", "default_pg"}
    assert first_difference(tails) is None and differences(tails) == []
    records = {rank: {"rank": rank, "error": "ValueError: refused", "collectives": entries}
               for rank, entries in tails.items()}
    assert explain(records) == []  # both ranks refused alike: nothing about collectives to add, and no crash
    # the tails as an older torchstage labelled them (one 'undefined' group with gaps in its numbers)
    merged = {rank: [{**e, "group": "undefined"} for e in entries] for rank, entries in tails.items()}
    assert first_difference(merged) is None
    assert first_difference({0: [entry(1), entry(3)], 1: [entry(1), entry(3), entry(4)]}) == (
        "First collective where the ranks differ (group 'default_pg', #4): rank 1 entered all_reduce(Float[10]) #4 "
        "called from train.py:5 in step, which rank 0 never reached; rank 0 last ran all_reduce(Float[10]) #3 called "
        "from train.py:5 in step.")
