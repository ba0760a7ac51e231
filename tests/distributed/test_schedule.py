"""The agreement channel's schedule: fixed every k batches, or about every ``period`` seconds with an interval the
ranks agree on (the smallest proposal), growing at most fourfold per agreement."""
from torchstage.distributed.schedule import CheckSchedule


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run_checks(schedule, clock, seconds_per_batch, batches, others=(), start=0):
    """Batches start+1..start+batches of one train loader; at each due batch the agreement read gives the
    smallest of this rank's previous proposal and ``others`` (the other ranks' proposals). Returns the steps
    checked."""
    checked, pending = [], None
    schedule.start_loader(start)
    for step in range(start + 1, start + batches + 1):
        clock.now += seconds_per_batch
        if schedule.due(step):
            checked.append(step)
            schedule.agreed(step, 0 if pending is None else min([pending, *others]))
            pending = schedule.proposal(step)
    return checked


def test_a_fixed_every_checks_every_kth_batch_and_proposes_nothing():
    clock = Clock()
    schedule = CheckSchedule(every=3, clock=clock)
    assert run_checks(schedule, clock, 0.001, 12) == [3, 6, 9, 12]
    assert schedule.proposal(12) == 0


def test_the_interval_grows_at_most_fourfold_to_the_batches_of_one_period():
    clock = Clock()
    schedule = CheckSchedule(period=0.5, clock=clock)
    checked = run_checks(schedule, clock, 0.01, 400)  # 50 batches of 10 ms make the half second
    gaps = [b - a for a, b in zip(checked, checked[1:])]
    assert gaps[:4] == [1, 4, 16, 50]
    assert set(gaps[4:]) == {50}


def test_the_smallest_proposal_wins_so_a_slower_rank_sets_the_pace():
    clock = Clock()
    schedule = CheckSchedule(period=0.5, clock=clock)
    checked = run_checks(schedule, clock, 0.001, 400, others=(5,))
    gaps = [b - a for a, b in zip(checked, checked[1:])]
    assert gaps[:2] == [1, 4] and set(gaps[2:]) == {5}


def test_a_new_loader_starts_again_from_one_batch_so_a_slower_stage_is_checked_within_its_period():
    clock = Clock()
    schedule = CheckSchedule(period=0.5, clock=clock)
    run_checks(schedule, clock, 0.001, 2000)  # fast: the interval grew to hundreds of batches
    assert schedule.interval > 100
    assert run_checks(schedule, clock, 0.5, 5, start=2000) == [2001, 2002, 2003, 2004, 2005]


def test_slow_batches_check_every_batch():
    clock = Clock()
    schedule = CheckSchedule(period=0.5, clock=clock)
    assert run_checks(schedule, clock, 2.0, 6) == [1, 2, 3, 4, 5, 6]
