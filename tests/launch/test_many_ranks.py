"""16 real gloo processes on this machine: the world forms, the results equal one process taking the same samples,
and a crash on one rank ends all 16 within seconds, naming it."""
from pathlib import Path
import json
import time

import pytest

from tests.helpers import alive, run

pytestmark = [pytest.mark.distributed, pytest.mark.alone]  # 16 ranks on every core, a crash ends all fast

SCRIPTS = Path(__file__).resolve().parent / "scripts"

SCRIPT = SCRIPTS / "many_ranks.py"


def result(completed) -> dict:
    line = next(line for line in completed.stdout.splitlines() if "RESULT " in line)
    return json.loads(line.split("RESULT ", 1)[1])


@pytest.mark.timeout(400)
def test_16_ranks_train_like_one_process_and_a_crash_ends_all_of_them(tmp_path):
    one = run([SCRIPT, tmp_path / "one"], timeout=120)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
    many = run([SCRIPT, tmp_path / "many"], nproc=16, timeout=300)
    assert many.returncode == 0, many.stdout[-2000:] + many.stderr[-3000:]
    assert "starting 16 processes (gloo, ranks 0-15 of 16)" in many.stdout + many.stderr
    reference, got = result(one), result(many)
    # float64: the 16 ranks' averaged gradients and their merged loss equal the single process's to rounding
    assert max(abs(a - b) for a, b in zip(reference["weights"], got["weights"])) < 1e-12
    assert abs(reference["loss"] - got["loss"]) < 1e-12

    crashed = run([SCRIPT, tmp_path / "crash"], nproc=16, timeout=300, CRASH_RANK=13)
    ended = time.time()
    out = crashed.stdout + crashed.stderr
    assert crashed.returncode == 1, out[-3000:]
    assert ended - float((tmp_path / "crash" / "crash-at").read_text()) < 20, out[-3000:]
    summary = [line for line in out.splitlines() if not line.startswith("[rank")]
    assert any(line.startswith("rank 13 exited with code 1; stopped the other ranks. The first error, on rank 13 at "
                               "stage 'main', epoch 1, batch 2 of loader 'train'") for line in summary), summary
    pids = [int(p.name) for p in (tmp_path / "crash" / "pids").iterdir()]
    deadline = time.monotonic() + 5
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) == 16 and not any(map(alive, pids))
