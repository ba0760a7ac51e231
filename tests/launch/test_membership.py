"""A world's nodes (host, agent, ranks) and its agreed restart count; what changed between two worlds, said plainly.
(The real thing, two torchrun agents losing and regaining a node, is tests/launch/test_elastic.py.)"""
import os
import socket

from torchstage.launch import resolve
from torchstage.launch.membership import agree_membership, changes, describe, this_node

A = {"host": "node-a", "agent": 100, "ranks": [0, 1]}
B = {"host": "node-b", "agent": 200, "ranks": [2, 3]}


def test_this_node_is_its_host_and_the_agent_that_started_it():
    assert this_node() == {"host": socket.gethostname(), "agent": os.getppid()}


def test_the_nodes_group_the_ranks_of_one_agent_and_the_restart_count_is_the_largest(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # this process: a node that came back
    seen = [({"host": "node-a", "agent": 100}, 1, 1), ({"host": "node-a", "agent": 100}, 1, 1),
            ({"host": "node-b", "agent": 300}, 0, 0), ({"host": "node-b", "agent": 300}, 0, 0)]
    try:
        nodes, restarts = agree_membership(lambda mine: seen)
        assert nodes == [A, {**B, "agent": 300}] and restarts == 1
        assert resolve.restart_attempt() == 1  # what this rank reports from now on: the job's count
        nodes, restarts = agree_membership(lambda mine: [mine])  # one process: its own count
        assert restarts == 0 and resolve.restart_attempt() == 0 and nodes[0]["ranks"] == [0]
    finally:
        resolve.set_agreed_attempt(0)


def test_what_changed_names_the_node_lost_the_node_joined_and_moved_ranks():
    assert describe(B, 4) == "node-b (agent pid 200) with ranks 2-3 of 4"
    assert changes([A, B], [A]) == ["lost node node-b (agent pid 200) with ranks 2-3 of 4"]
    assert changes([A], [A, {**B, "agent": 201}]) == ["joined node node-b (agent pid 201) with ranks 2-3 of 4"]
    assert changes([A, B], [{**B, "ranks": [0, 1]}, {**A, "ranks": [2, 3]}]) == [
        "node node-b (agent pid 200) with ranks 0-1 was ranks 2-3",
        "node node-a (agent pid 100) with ranks 2-3 was ranks 0-1"]
    assert changes([A, B], [A, B]) == []


def test_another_job_on_the_same_hosts_is_no_change_of_nodes():
    """A plain resume='last' by a new command on the same host has new agents: not "lost node vm ... joined node
    vm"; another job's nodes are told apart by host only, and a host gone or added is still said."""
    again = [{**A, "agent": 101}]
    assert changes([A], again) != []  # within one job (an elastic restart) the agent tells the nodes apart
    assert changes([A], again, by_agent=False) == []
    assert changes([A, B], [{**A, "agent": 101}], by_agent=False) == ["lost node node-b with ranks 2-3 of 4"]
    assert changes([A], [{**A, "agent": 7}, {**B, "agent": 8}], by_agent=False) == [
        "joined node node-b with ranks 2-3 of 4"]
