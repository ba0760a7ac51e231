"""The start-up watch: no silent wait before the first step. A rank stuck while building its datasets, a rank that
never reaches the rendezvous, and DeepSpeed waiting for a stale extension build lock each end the job (exit code 124)
with the rank, the phase and where it waits; the lock and the missing ranks are named early."""
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore
from torch.utils.cpp_extension import get_default_build_root
from torch.utils.file_baton import FileBaton

from tests import script_server
from tests.helpers import ROOT, run
from torchstage.launch import startup_watch
from torchstage.launch.local_launcher import free_port
from torchstage.launch.startup_waits import Arrivals, build_progress, format_age, lock_wait, ranges
from torchstage.launch.world import World

SCRIPT = ROOT / "tests" / "launch" / "scripts" / "slow_start.py"
OP = "deepspeed_shm_comm"  # the op DeepSpeed builds on first use on CPU (torch.utils.cpp_extension, under a lock)


def _line_of(text: str) -> int:
    """The line of the slow start script that holds ``text``."""
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


# ---- in one process ---------------------------------------------------------------------------------------
def test_ranges_and_ages_read_compactly():
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and ranges([3]) == "3"
    assert (format_age(45), format_age(725), format_age(3 * 3600 + 1200)) == ("45 s", "12 min 5 s", "3 h 20 min")


def test_no_watch_for_one_process_or_without_a_timeout():
    with startup_watch.watching(5, World()) as watch:
        assert watch is None
    with startup_watch.watching(None, World(rank=0, world_size=2)) as watch:
        assert watch is None
    startup_watch.phase("building the datasets")  # a mark without a watch costs nothing and does nothing


def test_a_wait_for_the_extension_build_lock_is_named_after_a_few_seconds(tmp_path, caplog, monkeypatch):
    """The lock's path, its age and what to do, while the wait goes on; the watch lets go once the lock is gone."""
    monkeypatch.setattr(startup_watch, "LOCK_NOTE_SECONDS", 1.0)
    lock = tmp_path / OP / "lock"
    lock.parent.mkdir()
    lock.touch()
    stale = time.time() - 7200
    os.utime(lock, (stale, stale))
    threading.Timer(3.0, lock.unlink).start()  # what the message tells the user to do
    caplog.set_level(logging.WARNING, logger="torchstage")
    with startup_watch.watching(60, World(rank=1, world_size=2), "setting up the strategy"):
        FileBaton(str(lock)).wait()
    assert startup_watch._current is None
    notes = [r.getMessage() for r in caplog.records if "extension build lock" in r.getMessage()]
    assert len(notes) == 1, notes
    assert (f"rank 1 waits for torch's extension build lock {lock}, created 2 h 0 min ago" in notes[0]
            and f"rm {lock}" in notes[0]), notes[0]


def test_a_lock_wait_is_seen_in_another_threads_stack_and_a_live_build_beside_it_is_progress(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - 600
    os.utime(lock, (old, old))
    waiter = threading.Thread(target=FileBaton(str(lock), wait_seconds=0.05).wait, daemon=True)
    waiter.start()
    time.sleep(0.2)
    found = lock_wait(sys._current_frames()[waiter.ident])
    assert found is not None and found.path == str(lock) and found.age() > 590
    now = time.monotonic()
    assert now - build_progress(None, found, now) > 590  # nothing changed beside the lock for 10 minutes
    (tmp_path / "shm.o").touch()  # a build at work writes its objects next to the lock
    assert now - build_progress(None, found, now) < 5
    lock.unlink()
    waiter.join(5)
    assert lock_wait(sys._current_frames().get(threading.get_ident())) is None


BUILD = """
import os, sys, time
from torchstage.launch import startup_watch
from torchstage.launch.world import World
fake = os.path.join("site-packages", "torch", "utils", "cpp_extension.py")  # torch's builder, as a stack shows it
exec(compile("def _run_ninja_build(seconds):\\n    time.sleep(seconds)\\n", fake, "exec"))
startup_watch.start(2.0, World(rank=0, world_size=2), "setting up the strategy")
_run_ninja_build(float(sys.argv[1]))  # compiling: progress, however long it takes
time.sleep(float(sys.argv[2]))  # loading what was built, then the first step
startup_watch.stop()
"""


@pytest.mark.timeout(60)
def test_a_build_longer_than_hang_timeout_is_progress_and_the_watch_counts_from_its_end():
    def run_build(build, after):
        return script_server.run([sys.executable, "-c", BUILD, str(build), str(after)],
                                 env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=50)
    done = run_build(4, 1)
    assert done.returncode == 0, done.stderr
    stuck = run_build(0, 4)  # no build: the same wait after it is a hang
    assert stuck.returncode == 124 and "while setting up the strategy" in stuck.stderr, stuck.stderr


def test_a_late_rendezvous_lists_the_ranks_on_its_store_or_says_the_store_does_not_answer():
    port = free_port()
    nobody = Arrivals(World(rank=1, world_size=2, master_port=port))
    nobody.register()
    assert f"the rendezvous store at 127.0.0.1:{port} does not answer" in nobody.describe()
    assert "rank 0 hosts it: rank 0 has not started forming the world yet" in nobody.describe()
    server = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=5), wait_for_workers=False)
    for rank in (1, 4):
        Arrivals(World(rank=rank, world_size=6, master_port=port)).register()
    late = Arrivals(World(rank=5, world_size=6, master_port=port))
    late.register()
    assert late.describe() == (f"ranks 1, 4-5 of 6 arrived at the rendezvous (127.0.0.1:{port}); ranks 0, 2-3 are "
                               f"missing (not started, or stuck before train())")
    del server


# ---- 2 real gloo ranks ------------------------------------------------------------------------------------
@pytest.mark.waits  # start-up timeouts of seconds
@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_a_rank_stuck_building_its_datasets_ends_the_job_naming_the_rank_the_phase_and_the_line(tmp_path):
    started = time.monotonic()
    result = run([SCRIPT, tmp_path / "logs"], timeout=200, START_MODE="datasets", START_TIMEOUT=3)
    out = result.stdout + result.stderr
    assert result.returncode == 124, out
    stuck_at = float((tmp_path / "logs" / "stuck-at").read_text())
    assert time.time() - stuck_at < 3 + 10, out  # hang_timeout, then the report and the others stopped
    line = f"slow_start.py:{_line_of('time.sleep(3600)')} in sleep_far_longer_than_any_test"
    summary = out.split("rank 1 exited with code 124; stopped the other ranks.")[1]
    assert ("The first error, on rank 1 at before training: hang during start-up: no progress for 3 s while "
            "building the datasets; stopped in ") in summary and line in summary, summary
    # the stack where it waits, down from train() to the dataset's construction
    assert f"slow_start.py\", line {_line_of('# the line the report names')}, in make_datasets" in summary, summary
    assert "torchstage/data/datasets.py" in summary and "in build_datasets" in summary
    assert "rank 0 finished" not in out
    print(f"start-up hang ended {time.time() - stuck_at:.1f} s after the rank got stuck "
          f"({time.monotonic() - started:.0f} s in all)")


@pytest.mark.waits  # start-up timeouts of seconds
@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_a_rendezvous_waiting_for_a_rank_says_which_it_has_and_lacks(tmp_path):
    result = run([SCRIPT, tmp_path / "logs"], timeout=200, START_MODE="late", START_TIMEOUT=15)
    out = result.stdout + result.stderr
    assert result.returncode == 124, out
    note = (r"\[rank0\]: torchstage: rank 0 has waited 1\d s to form the world: rank 0 of 2 arrived at the rendezvous "
            r"\(127\.0\.0\.1:\d+\); rank 1 is missing \(not started, or stuck before train\(\)\)")
    assert re.search(note, out), out
    summary = out.split("rank 0 exited with code 124; stopped the other ranks.")[1]
    assert ("hang during start-up: no progress for 15 s while forming the world; waiting in "
            "torch.distributed.init_process_group") in summary, summary


# ---- DeepSpeed and torch's extension build lock --------------------------------------------------------------
def _deepspeed(logdir, extensions, timeout, start_timeout=60):
    started = time.monotonic()
    result = run([SCRIPT, logdir], timeout=timeout, STRATEGY="deepspeed", START_TIMEOUT=start_timeout,
                 TORCH_EXTENSIONS_DIR=extensions)
    return result, result.stdout + result.stderr, time.monotonic() - started


@pytest.fixture(scope="module")
def built_op(tmp_path_factory):
    """A TORCH_EXTENSIONS_DIR of the tests' own holding DeepSpeed's op, built and loaded once here so that the run
    under test only loads it: seeded with a copy of the user's cache (taken under that cache's build lock, so never
    half-written by a build running beside it), then loaded by DeepSpeed itself, which rebuilds whatever the copy
    lacks or was built differently (a minute or more on 2 cores; without a cache, the whole build)."""
    pytest.importorskip("deepspeed")
    folder = tmp_path_factory.mktemp("extensions")
    roots = [os.environ.get("TORCH_EXTENSIONS_DIR"),
             os.path.join(get_default_build_root(), f"py{sys.version_info.major}{sys.version_info.minor}_cpu")]
    for root in filter(None, roots):
        source = os.path.join(root, OP)
        baton = FileBaton(os.path.join(source, "lock"))
        if os.path.exists(os.path.join(source, f"{OP}.so")) and baton.try_acquire():  # torch builds under it
            try:
                shutil.copytree(source, folder / OP, ignore=shutil.ignore_patterns("lock"))
            finally:
                baton.release()
            break
    build = ("from deepspeed.accelerator import get_accelerator; "
             "get_accelerator().create_op_builder('ShareMemCommBuilder').load()")
    subprocess.run([sys.executable, "-c", build], env={**os.environ, "TORCH_EXTENSIONS_DIR": str(folder),
                                                       "DS_ACCELERATOR": "cpu"}, check=True, timeout=900,
                   capture_output=True)
    return folder


@pytest.mark.waits  # start-up timeouts of seconds
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_deepspeed_waiting_for_a_stale_build_lock_ends_the_job_naming_the_lock(tmp_path):
    pytest.importorskip("deepspeed")
    lock = tmp_path / "extensions" / OP / "lock"  # left behind by a build that was killed
    lock.parent.mkdir(parents=True)
    lock.touch()
    stale = time.time() - 3600
    os.utime(lock, (stale, stale))
    # 30 s without progress: DeepSpeed's import and the ranks' start take under 10 s here, alone
    result, out, seconds = _deepspeed(tmp_path / "logs", tmp_path / "extensions", timeout=120, start_timeout=30)
    assert result.returncode == 124, out
    assert seconds < 90
    assert f"waits for torch's extension build lock {lock}, created 1 h 0 min ago" in out, out  # named early
    summary = out.split("exited with code 124; stopped the other ranks.")[1]
    assert (f"hang during start-up: no progress for 30 s while setting up the strategy (wrapping the models); "
            f"waiting for torch's extension build lock {lock}") in summary, summary
    assert f"rm {lock}" in summary and "file_baton.py" in summary
    print(f"stale lock: job ended after {seconds:.0f} s")


@pytest.mark.waits  # start-up timeouts of seconds
@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_deepspeed_without_the_lock_trains_and_shows_the_op_lines_once(tmp_path, built_op):
    result, out, seconds = _deepspeed(tmp_path / "logs", built_op, timeout=400)
    assert result.returncode == 0, out
    assert "rank 0 finished" in out and "rank 1 finished" in out
    assert "hang" not in out and "extension build lock" not in out
    assert out.count("built successfully") <= 1, out  # DeepSpeed's own line, by the main rank only
    assert out.count("FutureWarning") <= 1, out
    print(f"with the op built: trained in {seconds:.0f} s")
