"""The launcher: a failing rank stops the run within seconds, and no worker outlives the launcher."""
from pathlib import Path
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, alive, run, script_env

pytestmark = pytest.mark.distributed

SCRIPTS = Path(__file__).resolve().parent / "scripts"

PROBE = SCRIPTS / "probe.py"


def pids(logdir):
    folder = logdir / "pids"
    return [int(p.name) for p in folder.iterdir()] if folder.is_dir() else []


@pytest.mark.waits  # how fast
@pytest.mark.timeout(120)
def test_a_failing_rank_stops_the_run_fast_with_its_traceback(tmp_path):
    result = run([PROBE, tmp_path], nproc=2, PROBE_FAIL="1:2")
    ended = time.time()
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert ended - float((tmp_path / "failed-at").read_text()) < 10
    assert "[rank1]: RuntimeError: probe failure on rank 1 at epoch 2" in out
    assert "[rank1]: Traceback (most recent call last):" in out
    tail = out.split("rank 1 exited with code 1; stopped the other ranks")[1]  # the launcher repeats it last
    assert "RuntimeError: probe failure on rank 1 at epoch 2" in tail
    workers = pids(tmp_path)
    assert len(workers) == 2 and not any(alive(pid) for pid in workers)
    assert "epoch 2/3" not in out  # rank 0 never finished epoch 2
    assert (tmp_path / "checkpoints" / "last.pth").is_file()  # epoch 1 was saved, once, by rank 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -9), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_workers_do_not_outlive_the_launcher(tmp_path, sig, code):
    launcher = subprocess.Popen([sys.executable, str(PROBE), str(tmp_path)], cwd=ROOT,
                                env=script_env(2, PROBE_EPOCHS=1000, PROBE_SLEEP=0.01),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.monotonic() + 90
        while len(workers) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.2)
            workers = pids(tmp_path)
        assert len(workers) == 2, "the workers did not start"
        launcher.send_signal(sig)
        assert launcher.wait(timeout=15) == code
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in workers)
    finally:
        for pid in [launcher.pid, *workers]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait()
