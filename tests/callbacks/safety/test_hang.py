"""Hang detection and uneven batch counts, with 2 real gloo ranks: the job ends with a report, never a silent wait."""
from pathlib import Path
import time

import pytest

from tests.helpers import alive, run

pytestmark = [pytest.mark.distributed, pytest.mark.waits]  # a 3 s hang_timeout

SCRIPTS = Path(__file__).resolve().parent / "scripts"

HANG = SCRIPTS / "hang.py"
TIMEOUT = 3  # the runs' hang_timeout, seconds


def pids(logdir):
    folder = logdir / "pids"
    return [int(p.name) for p in folder.iterdir()] if folder.is_dir() else []


def no_worker_left(logdir, nproc=2):
    workers = pids(logdir)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(workers) == nproc and not any(alive(pid) for pid in workers)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode, rank, function", [("sleep", 1, "stuck_in_user_code"),
                                                  ("deadlock", 0, "deadlocked_in_user_code")])
def test_a_hung_rank_ends_the_job_naming_it_where_it_was_and_its_stack(tmp_path, mode, rank, function):
    result = run([HANG, tmp_path], nproc=2, timeout=150, HANG_MODE=mode, HANG_RANK=rank, HANG_TIMEOUT=TIMEOUT)
    ended = time.time()
    out = result.stdout + result.stderr
    assert result.returncode == 124, out
    assert ended - float((tmp_path / "stuck-at").read_text()) < TIMEOUT + 10, out
    assert f"[rank{rank}]: torchstage: rank {rank} made no progress for 3 s (hang_timeout=3)" in out
    # the launcher repeats the stuck rank's report last: its stack, where each rank was, who stopped first
    tail = out.split(f"rank {rank} exited with code 124; stopped the other ranks")[1]
    assert f'in {function}\n' in tail and "hang.py" in tail  # the stuck rank's Python stack
    assert (f"rank {rank} (this rank): " in tail and "stage 'main', epoch 1, loader 'train', batch 3 (after batch end); "
            f"stopped in " in tail), tail
    other = 1 - rank
    # the other rank waits in the next batch's gradient all-reduce (the stop agreement of the batch before runs
    # in the background), and the ranks' recorded collectives say which one the stuck rank never reached
    assert f"rank {other}: " in tail and "waiting in a backward pass (DDP all-reduces gradients there)" in tail, tail
    assert f"which rank {rank} never reached; rank {rank} last ran " in tail, tail
    assert f"Stopped outside any collective (what the others wait for): rank {rank}." in tail
    assert f"torchstage: hang detected on rank {rank}; ending the job with exit code 124." in tail
    assert no_worker_left(tmp_path)


@pytest.mark.timeout(180)
def test_uneven_batch_counts_fail_before_the_first_batch_naming_each_rank(tmp_path):
    result = run([HANG, tmp_path], nproc=2, timeout=150, HANG_MODE="uneven")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert ("UnevenBatchesError: loader 'train' has a different number of batches on each rank "
            "(rank 0: 5, rank 1: 6); every rank needs the same number of training batches") in out
    assert "drop_last=True" in out
    assert "Received data size" not in out and "epoch 1/2" not in out
    assert no_worker_left(tmp_path)


@pytest.mark.timeout(180)
def test_uneven_batch_counts_of_a_loader_without_length_end_in_a_hang_report(tmp_path):
    result = run([HANG, tmp_path], nproc=2, timeout=150, HANG_MODE="uneven-unknown", HANG_TIMEOUT=TIMEOUT)
    out = result.stdout + result.stderr
    assert result.returncode == 124, out
    assert "Received data size" not in out
    assert ("Ranks [0] finished loader 'train' while ranks [1] still run its batches: the ranks have different "
            "numbers of batches") in out, out
    assert no_worker_left(tmp_path)


@pytest.mark.timeout(180)
def test_a_slow_but_progressing_run_is_unaffected(tmp_path):
    # batches of 0.5 s each, and 2 epochs of about 8 s, under a 3 s hang_timeout
    result = run([HANG, tmp_path], nproc=2, timeout=150, HANG_MODE="none", HANG_SLEEP=0.5, HANG_TIMEOUT=TIMEOUT)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "rank 0 finished" in out and "rank 1 finished" in out
    assert "hang detected" not in out


@pytest.mark.timeout(180)
def test_the_headlines_of_a_hang_name_the_hung_rank_not_the_one_that_reports(tmp_path):
    # rank 3 waits in a recv nobody sends to, after batch 2; the others wait for it in the next batch's collectives,
    # so every rank waits inside torch.distributed and rank 0's watchdog reports first
    result = run([HANG, tmp_path], nproc=4, timeout=150, HANG_MODE="recv", HANG_RANK=3, HANG_BATCH=2,
                 HANG_TIMEOUT=TIMEOUT)
    out = result.stdout + result.stderr
    assert result.returncode == 124, out
    recv = f"hang.py:{next(n for n, text in enumerate(HANG.read_text().splitlines(), 1) if '# the recv' in text)}"
    headline = next(line for line in out.splitlines() if "; stopped the other ranks." in line)
    assert "The first error, on rank 3 at stage 'main', epoch 1, batch 2 of loader 'train'" in headline, out
    assert "waiting in torch.distributed.recv called from " in headline and recv in headline, headline
    if headline.startswith("rank 0 exited"):  # the usual order: rank 0's record names rank 3
        assert ("hang: rank 3 made no progress after stage 'main', epoch 1, loader 'train', batch 2 (after batch end)"
                in headline and "(reported by rank 0)" in headline), headline
        assert ("[rank0]: torchstage: rank 3 hangs, and the other ranks wait for it: no progress since stage 'main', "
                "epoch 1, loader 'train', batch 2 (after batch end); waiting in torch.distributed.recv") in out, out
        assert "torchstage: hang of rank 3 detected on rank 0; ending the job with exit code 124." in out, out
    assert len(pids(tmp_path)) == 4 and no_worker_left(tmp_path, 4)
