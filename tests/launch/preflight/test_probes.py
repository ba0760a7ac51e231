"""The probes on one process (matmul and memory figures a CPU can give) and the exchange rounds: every pair of nodes
meets once, pairs within a round are disjoint, and one node's ranks meet a few others."""
import itertools

import torch

from torchstage.launch.preflight import probes


def test_matmul_and_memory_give_the_speed_of_this_cpu():
    torch.set_num_threads(1)
    flops = probes.matmul(torch.device("cpu"), 0.1)
    bandwidth = probes.HostMemory(8 * 2**20).probe(0.1)
    assert 0.1 < flops < 10_000  # GFLOP/s of one thread of any CPU
    assert 0.1 < bandwidth < 1_000  # GB/s


def test_rounds_pair_every_two_nodes_once_rank_by_rank():
    nodes = {f"n{i}": [2 * i, 2 * i + 1] for i in range(5)}  # 5 nodes: one sits out of each round
    rounds = probes.rounds(nodes, max_rounds=10)
    assert len(rounds) == 5
    met = set()
    for pairs in rounds:
        ranks = [r for pair in pairs for r in pair]
        assert len(ranks) == len(set(ranks))  # disjoint: a rank exchanges with one peer at a time
        for a, b in pairs:
            assert a // 2 != b // 2 and a % 2 == b % 2  # other node, same local index
            met.add(frozenset((a // 2, b // 2)))
    assert met == {frozenset(p) for p in itertools.combinations(range(5), 2)}
    assert len(probes.rounds(nodes, max_rounds=2)) == 2


def test_one_node_meets_a_few_peers_and_two_nodes_one_round():
    assert probes.rounds({"a": [0, 1, 2, 3]}) == [[(0, 3), (1, 2)], [(0, 2), (3, 1)], [(0, 1), (2, 3)]]
    assert len(probes.rounds({"a": list(range(16))})) == 3
    assert probes.rounds({"a": [0, 1], "b": [2, 3]}) == [[(0, 2), (1, 3)]]
    assert probes.rounds({"a": [0]}) == []
