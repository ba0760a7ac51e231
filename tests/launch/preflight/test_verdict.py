"""The pre-flight verdict on numbers: outliers against the median of the other ranks, links judged only where a rank
met several peers between hosts, one table per node, the --exclude under SLURM, the exit code."""
import pytest

from torchstage.launch.preflight.check import Preflight
from torchstage.launch.preflight.verdict import RankFigures, excluded, node_links, outliers, report


def figures(rank, host, matmul, memory=10.0, link=(), links=None, **extra):
    return RankFigures(rank, host, rank % 2, "cpu (1 thread)", [matmul] * 3, [memory] * 3, list(link),
                       links or {}, **extra)


def two_nodes(slow_matmul=30.0, slow_memory=10.0):
    return [figures(0, "node1", 30.0), figures(1, "node1", 31.0),
            figures(2, "node2", slow_matmul, slow_memory), figures(3, "node2", slow_matmul * 1.02, slow_memory)]


def test_a_slow_node_is_named_by_rank_and_host_and_excluded():
    ranks = two_nodes(slow_matmul=12.0, slow_memory=4.0)
    found = outliers(ranks)
    assert [(o.rank, o.host, o.measure) for o in found] == [(2, "node2", "matmul"), (2, "node2", "memory"),
                                                             (3, "node2", "matmul"), (3, "node2", "memory")]
    # half the ranks slow: each is compared with the median of the others (two fast, one slow), not of all
    assert found[0].median == pytest.approx(30.0) and found[0].below == pytest.approx(0.6)
    assert excluded(found) == ["node2"]
    text = report(ranks, found, 1.5, 0.2, slurm=True)
    assert text.splitlines()[0] == "node node1 (2 ranks)" and "node node2 (2 ranks)" in text
    # every rank of node2 is slow: the node's doing, named as the host, not rank by rank
    assert "host node2, all its 2 ranks (2-3): matmul 12.12 GFLOP/s against 30.00 for the others (-60%): the node, " \
           "not one rank" in text and "rank 2 on node2" not in text
    assert text.endswith("resubmit without them: --exclude=node2")
    assert "all-reduce over the 4 ranks: 1.50 GB/s bus bandwidth" in text
    assert Preflight(ranks, found, 1.5, text, ["node2"]).exit_code == 1
    assert "--exclude" not in report(ranks, found, 1.5, 0.2, slurm=False)
    assert report(ranks, found, 1.5, 0.2, slurm=False).endswith("slow host: node2")


def test_ranks_within_the_threshold_agree():
    ranks = two_nodes(slow_matmul=25.0)  # 17 % below: under the 20 % threshold
    assert outliers(ranks) == [] and outliers(ranks, threshold=0.1) != []
    text = report(ranks, [], None, 0.2, slurm=True)
    assert text.endswith("all 4 ranks agree (none is 20% or more below the median of the others)")
    assert Preflight(ranks, [], None, text, []).exit_code == 0


def test_the_median_of_the_repeats_counts_not_one_slow_repeat():
    ranks = [RankFigures(r, "a", r, "cpu", [30.0, 30.0, 30.0], [10.0] * 3) for r in range(3)]
    ranks[1].matmul = [30.0, 5.0, 29.0]  # one repeat under load
    assert outliers(ranks) == []
    ranks[1].matmul = [20.0, 5.0, 22.0]
    assert [o.rank for o in outliers(ranks)] == [1]


def test_links_are_judged_only_for_ranks_that_met_several_peers_on_other_hosts():
    peers = {0: {1: 2.0, 2: 2.0}, 1: {0: 2.0, 2: 2.0}, 2: {0: 0.5, 1: 0.5}}
    ranks = [figures(r, f"n{r}", 30.0, link=[peers[r][p] for p in peers[r]][:1] * 3, links=peers[r]) for r in range(3)]
    ranks[2].link = [0.5] * 3
    assert [(o.rank, o.measure) for o in outliers(ranks)] == [(2, "link")]
    for r in ranks:  # one host's CPU processes: loopback, not judged
        r.judge_link = False
    assert outliers(ranks) == []
    pair = [figures(0, "n1", 30.0, link=[2.0] * 3, links={1: 2.0}), figures(1, "n2", 30.0, link=[0.5] * 3,
                                                                            links={0: 0.5})]
    assert outliers(pair) == []  # one peer each: which side is slow cannot be told


def test_node_links_are_the_median_exchange_between_two_hosts():
    ranks = [figures(0, "a", 1, links={2: 1.0}), figures(1, "a", 1, links={3: 3.0}),
             figures(2, "b", 1, links={0: 1.0}), figures(3, "b", 1, links={1: 3.0})]
    assert node_links(ranks) == {("a", "b"): 2.0}
    assert "links between nodes: a-b 2.00 GB/s" in report(ranks, [], None, 0.2, False)


def test_one_process_and_crowded_cores_are_said():
    alone = [figures(0, "laptop", 30.0)]
    assert outliers(alone) == []
    assert report(alone, [], None, 0.2, False).endswith("one process: nothing to compare (start it under srun, "
                                                        "torchrun or mpirun, or with --nprocs N)")
    crowded = [figures(r, "vm", 30.0, crowding=2.0) for r in range(4)]
    assert "note: vm runs 2.0 processes per CPU: they take turns on the cores" in report(crowded, [], None, 0.2, False)


def test_one_slow_rank_of_a_node_is_named_as_the_rank():
    ranks = two_nodes()
    ranks[3] = figures(3, "node2", 12.0)
    text = report(ranks, outliers(ranks), None, 0.2, slurm=False)
    assert "rank 3 on node2: matmul 12.00 GFLOP/s against 30.00 for the others (-60%)" in text and "host node2" not in text


def test_the_only_host_is_never_named_slow_nor_excluded():
    """Two ranks on one host, one slower: the host is not slower than itself; nothing to exclude, even under SLURM."""
    ranks = [figures(0, "vm", 30.0), figures(1, "vm", 12.0)]
    found = outliers(ranks)
    assert [o.rank for o in found] == [1] and excluded(found, ranks) == []
    for slurm in (False, True):
        text = report(ranks, found, None, 0.2, slurm=slurm)
        assert "slow host" not in text and "--exclude" not in text
        assert text.endswith("every rank runs on vm: the outliers are ranks of it, not a slower host (look at what "
                             "shares their cores, and at their binding)"), text


def _ticks(busy, idle, steal=0):
    return ((0, 0, 0), (busy + idle + steal, idle, steal))


def test_a_host_full_of_other_work_gets_a_low_confidence_verdict():
    """2 CPUs for 1 s (200 ticks): 190 busy, 0.6 s of it the job's two ranks: 1.3 cores of other work filled them."""
    ranks = [figures(0, "vm", 30.0, cpu_seconds=0.3, wall=1.0, cpus=2.0, node_ticks=_ticks(190, 10)),
             figures(1, "vm", 12.0, cpu_seconds=0.3, wall=1.0, cpus=2.0, node_ticks=_ticks(190, 10))]
    text = report(ranks, outliers(ranks), None, 0.2, slurm=False)
    assert "confidence low: host vm is shared: other work used 1.3 of its 2 CPUs (this job 0.6), so the cores were " \
           "full: its ranks are measured as the kernel shares the cores, not as their hardware runs" in text, text
    assert "rank 1 on vm: matmul 12.00 GFLOP/s against 30.00 for the others (-60%) (low confidence)" in text
    quiet = [figures(r, "vm", 30.0, cpu_seconds=0.9, wall=1.0, cpus=2.0, node_ticks=_ticks(190, 10)) for r in range(2)]
    assert "confidence" not in report(quiet, [], None, 0.2, slurm=False)  # the job alone filled its cores
