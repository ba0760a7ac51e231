"""The straggler rule on numbers: who is named, after how many windows, when not (noise, a small share, a short
slowdown), recovery with hysteresis, worse, two ranks, and windows built from several agreements."""
import pytest

from torchstage.callbacks.monitoring.straggler_rule import MIN_EXCESS, StragglerRule


def window(rule, compute, data=None, wait=None, batches=100):
    """One window of ``batches`` batches: per-rank seconds per batch (scaled to sums)."""
    n = rule.world_size
    data = data or [0.001] * n
    wait = wait or [0.0] * n
    return rule.add([d * batches for d in data], [c * batches for c in compute], [w * batches for w in wait], batches)


def rule4(**kwargs):
    return StragglerRule(4, **{"window": 1.0, **kwargs})


def test_a_rank_slow_for_patience_windows_is_named_once_with_its_figures():
    rule = rule4()
    slow = [0.010, 0.010, 0.016, 0.010]  # rank 2: 60 % more compute
    assert window(rule, slow) == [] and window(rule, slow) == []
    (found,) = window(rule, slow)
    assert (found.kind, found.rank, found.part, found.windows) == ("slow", 2, "compute", 3)
    assert found.value == pytest.approx(0.016) and found.median == pytest.approx(0.010)
    assert found.excess == pytest.approx(0.6)
    # every rank waits for rank 2: the job's step is the median step (11 ms), of which 6 ms are rank 2's excess
    assert found.share == pytest.approx(0.006 / 0.011)
    assert all(window(rule, slow) == [] for _ in range(5))  # once per episode, not per window
    assert rule.named() == [(2, "compute")]


def test_noise_a_short_slowdown_and_a_small_share_name_nobody():
    rule = rule4()
    assert window(rule, [0.010, 0.011, 0.0105, 0.0098]) == []  # under the threshold
    for _ in range(2):
        assert window(rule, [0.010, 0.010, 0.016, 0.010]) == []
    assert window(rule, [0.010, 0.010, 0.010, 0.010]) == []  # two slow windows, then back: the streak is over
    assert window(rule, [0.010, 0.010, 0.016, 0.010]) == []
    rule = rule4()
    small = dict(compute=[0.100] * 4, data=[0.001, 0.001, 0.003, 0.001])  # data 3x the median, 2 % of the job's time
    assert all(window(rule, **small) == [] for _ in range(5))
    rule = rule4(min_share=0.0)
    tiny = dict(compute=[0.001] * 4, data=[1e-5, 1e-5, 1e-5 + MIN_EXCESS / 2, 1e-5])  # less than MIN_EXCESS per batch
    assert all(window(rule, **tiny) == [] for _ in range(5))


def test_data_slowness_is_named_as_data_and_the_ranks_that_wait_for_it_are_not():
    rule = rule4()
    for _ in range(2):
        assert window(rule, [0.010] * 4, data=[0.001, 0.012, 0.001, 0.001], wait=[0.011, 0.0, 0.011, 0.011]) == []
    (found,) = window(rule, [0.010] * 4, data=[0.001, 0.012, 0.001, 0.001], wait=[0.011, 0.0, 0.011, 0.011])
    assert (found.kind, found.rank, found.part) == ("slow", 1, "data")


def test_recovery_needs_patience_windows_under_half_the_threshold():
    rule = rule4()
    for _ in range(3):
        window(rule, [0.010, 0.010, 0.016, 0.010])
    for _ in range(5):  # 15 % above: no longer slow, not yet recovered (hysteresis)
        assert window(rule, [0.010, 0.010, 0.0115, 0.010]) == []
    assert window(rule, [0.010] * 4) == [] and window(rule, [0.010] * 4) == []
    (found,) = window(rule, [0.010] * 4)
    assert (found.kind, found.rank, found.windows) == ("recovered", 2, 3)
    assert found.worst == pytest.approx(0.006 / 0.011)
    assert rule.named() == []
    for _ in range(2):  # named again only after a new streak
        assert window(rule, [0.010, 0.010, 0.016, 0.010]) == []
    assert window(rule, [0.010, 0.010, 0.016, 0.010])[0].kind == "slow"


def test_worse_is_reported_when_the_share_grows_by_half_for_patience_windows():
    rule = rule4()
    for _ in range(3):
        window(rule, [0.010, 0.010, 0.013, 0.010])
    worse = [0.010, 0.010, 0.030, 0.010]
    assert window(rule, worse) == [] and window(rule, worse) == []
    (found,) = window(rule, worse)
    assert (found.kind, found.rank) == ("worse", 2) and found.share > 0.6
    assert all(window(rule, worse) == [] for _ in range(4))  # reported once at that level


def test_two_ranks_compare_with_each_other_and_only_the_slow_one_is_named():
    rule = StragglerRule(2, window=1.0)
    for _ in range(2):
        assert window(rule, [0.010, 0.015]) == []
    (found,) = window(rule, [0.010, 0.015])
    assert (found.rank, found.median) == (1, pytest.approx(0.010))


def test_half_the_ranks_slow_are_each_named_against_the_fast_ones():
    rule = rule4()
    for _ in range(2):
        window(rule, [0.010, 0.010, 0.016, 0.016])
    found = window(rule, [0.010, 0.010, 0.016, 0.016])
    assert sorted(f.rank for f in found) == [2, 3]


def test_a_window_is_judged_once_it_covers_window_seconds_of_training():
    rule = StragglerRule(4, window=2.0, patience=1)
    slow = [[0.010, 0.010, 0.020, 0.010]]
    # 50 batches of about 12 ms: 0.6 s each; the fourth completes 2 s
    assert [window(rule, *slow, batches=50) for _ in range(3)] == [[], [], []]
    assert rule.last_window is None
    (found,) = window(rule, *slow, batches=50)
    assert found.rank == 2 and rule.last_window["compute"][2] == pytest.approx(0.020)


def test_ended_reports_a_rank_still_slow_with_its_last_figures():
    rule = rule4()
    for _ in range(3):
        window(rule, [0.010, 0.010, 0.016, 0.010])
    window(rule, [0.010, 0.010, 0.018, 0.010])
    found = rule.ended(2, "compute")
    assert (found.kind, found.value) == ("ended", pytest.approx(0.018)) and rule.named() == []


def test_a_node_whose_every_rank_is_slow_is_said_of_the_node_and_a_shared_host_lowers_confidence():
    from torchstage.callbacks.monitoring.straggler_rule import Finding, note
    from torchstage.launch.node_load import NodeLoad
    places = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    slow = Finding("slow", 2, "compute", 0.15, 0.10, 0.3)
    assert note(slow, places, [(2, "compute")]) == ""  # one rank of b: the rank
    assert note(slow, places, [(2, "compute"), (3, "compute")]) == (
        "; every rank of host b (2, 3) is slow in compute: the node, not this rank")
    alone = Finding("slow", 1, "compute", 0.15, 0.10, 0.3)
    assert note(alone, [("a", 0), ("a", 1)], [(0, "compute"), (1, "compute")]) == ""  # one host: nothing to compare
    shared = NodeLoad("b", 2, busy=2.0, own=0.8, steal=0.0, ranks=2)
    assert note(slow, places, [(2, "compute")], shared) == (
        "; confidence low: host b is shared: other work used 1.2 of its 2 CPUs (this job 0.8), so the cores were full "
        "(the slowness may be its neighbours' on its cores, not this rank's)")
    assert note(slow, places, [(2, "compute")], NodeLoad("b", 8, 2.0, 2.0, 0.0, 2)) == ""  # the node ran the job alone
