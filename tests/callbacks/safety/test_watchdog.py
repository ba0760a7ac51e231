"""hang_timeout as an argument, the process group's timeout, and the report's wording
(real ranks: tests/callbacks/safety/test_hang.py)."""
import time
from datetime import timedelta

import pytest

from tests.helpers import tiny_run
from torchstage import Callback, HangWatchdog
from torchstage.callbacks.safety.hang_report import hang_report
from torchstage.launch.enter import process_group_timeout


def train(**kwargs):
    return tiny_run(**kwargs)


@pytest.mark.parametrize("value", ["soon", -1, True, float("nan"), float("inf")])
def test_a_malformed_hang_timeout_is_refused_naming_the_argument(value):
    with pytest.raises(ValueError, match=r"hang_timeout must be a number of seconds > 0, or None/0 to disable"):
        train(hang_timeout=value)


def test_the_process_group_times_out_a_minute_after_the_watchdog():
    assert process_group_timeout(3) == timedelta(seconds=63)
    assert process_group_timeout(300) == timedelta(seconds=360)
    assert process_group_timeout(None) is None and process_group_timeout(0) is None
    assert HangWatchdog(0).timeout is None and HangWatchdog(2.5).timeout == 2.5


def test_a_single_process_is_not_watched():
    class Pause(Callback):
        def on_batch_end(self, runner):
            if runner.batch_step == 1 and runner.is_train_loader:
                time.sleep(1.0)  # a breakpoint, a slow first step: no peer waits on a single process

    runner = train(hang_timeout=0.2, callbacks=[Pause()])
    assert runner.callbacks["watchdog"]._thread is None


def test_the_report_names_the_rank_the_others_wait_for_and_ends_with_it():
    now = time.time()
    where = {"stage": "main", "epoch": 2, "loader": "train"}
    ranks = {0: {**where, "time": now - 4, "event": "batch end", "batch": 7,
                 "waiting": "torch.distributed.all_reduce called from stop.py:62 in agree", "frame": "x"},
             1: {**where, "time": now - 5, "event": "batch start", "batch": 7, "waiting": None,
                 "frame": "train.py:28 in load_shard"},
             2: {**where, "time": now - 3, "event": "batch end", "batch": 8}}
    text = hang_report(1, 3.0, ranks, ['  File "train.py", line 28, in load_shard\n'], 124)
    lines = text.splitlines()
    assert lines[0] == ("torchstage: rank 1 made no progress for 3 s (hang_timeout=3). Python stack of its training "
                        "thread (most recent call last):")
    assert lines[1] == '  File "train.py", line 28, in load_shard'
    table = lines[lines.index("Where each rank last made progress:") + 1:]
    assert table[0].startswith("  rank 1 (this rank): 5.0 s ago, stage 'main', epoch 2, loader 'train', batch 7 "
                               "(after batch start); stopped in train.py:28 in load_shard")
    assert table[1].startswith("  rank 0: 4.0 s ago") and "waiting in torch.distributed.all_reduce" in table[1]
    assert table[2].startswith("  rank 2: 3.0 s ago") and table[2].endswith("batch 8 (after batch end)")
    assert "Stopped outside any collective (what the others wait for): rank 1." in text
    assert lines[-1] == "torchstage: hang detected on rank 1; ending the job with exit code 124."
