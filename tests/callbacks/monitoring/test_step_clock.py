"""One rank's batches split into data, compute and wait: the sums of a step clock on a clock we drive, and the
wait at the end of backward under a real 2-rank DDP (gloo) where one rank is late: the early rank waits for it, the
late one does not, and the gradients are the same as without the hooks, which come off again."""
import json
import statistics
import sys

import pytest

from tests import script_server
from tests.helpers import ROOT, script_env
from torchstage.callbacks.monitoring.step_clock import StepClock


class Wait:
    def __init__(self):
        self.next = 0.0

    def take(self):
        value, self.next = self.next, 0.0
        return value


def test_the_clock_sums_data_step_and_wait_per_window_and_loader():
    now = [0.0]
    wait = Wait()
    clock = StepClock(wait, clock=lambda: now[0])
    clock.loader_start()
    for data, step, waited in ((5.0, 1.0, 0.2), (0.5, 2.0, 0.5), (0.25, 1.5, 0.0)):
        now[0] += data
        clock.batch_start()
        now[0] += step
        wait.next = waited
        clock.batch_end()
    # the first batch's data (workers starting) is left out; compute is the step less the wait
    assert clock.take() == pytest.approx((0.75, 4.5 - 0.7, 0.7, 3))
    assert clock.take() == (0.0, 0.0, 0.0, 0)
    assert clock.loader_sums() == pytest.approx((0.75, 3.8, 0.7, 3))
    clock.loader_start()
    assert clock.loader_sums() == (0.0, 0.0, 0.0, 0)


@pytest.mark.alone  # measures the wait
@pytest.mark.distributed
@pytest.mark.timeout(200)
def test_the_wait_at_the_end_of_backward_is_the_time_a_rank_waits_for_the_late_one(tmp_path):
    result = script_server.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(ROOT / "tests" / "callbacks" / "monitoring" / "scripts" / "backward_wait.py"),
                             str(tmp_path)], env=script_env(), cwd=ROOT, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    early, late = (json.loads((tmp_path / f"wait-rank{r}.json").read_text()) for r in (0, 1))
    # rank 1 sleeps 50 ms before each step: rank 0 waits about that long in the all-reduce, rank 1 hardly at all
    assert 40 < statistics.median(early["waits"]) < 200, early["waits"]
    assert statistics.median(late["waits"]) < 20, late["waits"]
    assert early["same_grads"] and late["same_grads"]
    assert early["hooks_left"] == late["hooks_left"] == 0
