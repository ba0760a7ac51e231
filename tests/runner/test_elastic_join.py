"""When a logdir's run is this elastic job's own, continued by a world torchrun re-formed (a node joined without a
failure): the same torchelastic run, an agent in common, written before this process started."""
import time

from torchstage.runner.elastic_join import joined_world, process_start

NODE = {"host": "vm", "agent": 4242, "ranks": [0, 1]}


def _meta(run="job-1", nodes=(NODE,), written=None):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(written if written is not None else time.time() - 3600))
    return {"meta": {"job": {"torchelastic_run": run}, "nodes": list(nodes), "time": stamp}}


def test_a_world_re_formed_around_a_joined_node_continues_its_own_run(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    now = [NODE, {"host": "vm", "agent": 5151, "ranks": [2, 3]}]
    why = joined_world(_meta(), now)
    assert why.startswith("it was written by this torchelastic run (job-1), whose agent pid 4242 on vm is in this "
                          "world, before these workers started"), why


def test_another_launch_a_new_agent_or_a_live_process_is_no_continuation(monkeypatch):
    now = [{**NODE, "agent": 9999}]
    assert joined_world(_meta(), [NODE]) is None  # not under torchelastic
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    assert joined_world(_meta(run="job-0"), [NODE]) is None  # another run id
    assert joined_world(_meta(), now) is None  # a new launch: none of its agents wrote it
    assert joined_world(_meta(written=time.time() + 60), [NODE]) is None  # this process was alive: a second train()
    assert process_start() < time.time()
