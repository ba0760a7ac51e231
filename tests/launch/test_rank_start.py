"""How ranks start: forked from a preloaded process (the default) or fresh interpreters (TORCHSTAGE_START=fresh).

Real launches of tests/launch/scripts/start_state.py on 2 gloo processes: a preloaded rank sees at its program's
first line what a fresh interpreter sees (threads, CUDA, torch's thread count, every generator, signal handlers,
output buffering, its own folder's modules run again) and trains to bitwise the same weights; a launching process
that is unsafe to copy is not forked; restarts and kills keep working.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, alive, script_env
from tests.stacks import descendants
from torchstage.launch.failure_folder import PREFIX, sweep
from torchstage.launch.fork_safety import native_threads, unsafe_to_fork
from torchstage.launch.forked_rank import local_modules

pytestmark = pytest.mark.distributed
SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: What a rank sees at its program's first line that must not depend on how it started.
SAME = ("python_threads", "cuda_initialized", "num_threads", "initial_seed", "torch_rand", "python_random",
        "numpy_random", "helper_draw", "handlers", "stdout", "stderr", "name", "argv", "orig_argv")


def launch(outdir, start, nproc=2, ignored=(), **extra):
    """Run start_state.py under torchstage's launcher; ``ignored``: signal names ignored when it starts (as under
    ``nohup``, or for a ``cmd &`` of a script: an exec keeps an ignored signal ignored)."""
    env = script_env(nproc, TORCHSTAGE_START=start, TORCHSTAGE_SCRIPT_SEED=1234, **extra)  # one seed for both starts
    env.pop("OMP_NUM_THREADS", None)  # the launching process uses every core; its ranks get cores / ranks
    command = [sys.executable, str(SCRIPTS / "start_state.py"), str(outdir)]
    if ignored:
        command = [sys.executable, "-c", "import os, signal, sys\nfor name in sys.argv[1].split(','):\n"
                   "    signal.signal(getattr(signal, name), signal.SIG_IGN)\nos.execv(sys.argv[2], sys.argv[2:])",
                   ",".join(ignored), *command]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return result, result.stdout + result.stderr


def states(outdir, start, attempt=0, nproc=2):
    return [json.loads((outdir / f"state-{start}-a{attempt}-rank{rank}.json").read_text()) for rank in range(nproc)]


@pytest.mark.timeout(600)
def test_a_preloaded_rank_starts_as_a_fresh_interpreter_would_and_trains_to_the_same_weights(tmp_path):
    fresh_run, fresh_out = launch(tmp_path, "fresh")
    assert fresh_run.returncode == 0, fresh_out[-3000:]
    run, out = launch(tmp_path, "preloaded")
    assert run.returncode == 0, out[-3000:]
    assert "forked from a preloaded process" in out and "in fresh interpreters (TORCHSTAGE_START=fresh)" in fresh_out
    fresh, preloaded = states(tmp_path, "fresh"), states(tmp_path, "preloaded")
    for before, after in zip(fresh, preloaded):
        assert after["torch._dynamo loaded"] and not before["torch._dynamo loaded"]  # the preload's saving
        assert before["parent_is_launcher"] and not after["parent_is_launcher"]
        assert after["parent_command"][1:] == before["parent_command"][1:]  # forked from the launching process
        assert {key: after[key] for key in SAME} == {key: before[key] for key in SAME}
        assert after["python_threads"] == ["MainThread"] and after["cuda_initialized"] is False
        assert after["num_threads"] == max(1, os.cpu_count() // 2)  # not the launching process's count
        assert after["handlers"]["SIGUSR2"] == "<Handlers.SIG_DFL: 0>"  # the launcher's own handler stays there
        assert after["weights"] == before["weights"] and after["world_size"] == 2
    assert preloaded[0]["weights"] == preloaded[1]["weights"]
    assert preloaded[0]["torch_rand"] == preloaded[1]["torch_rand"]  # module-level data agrees across ranks
    for start, text in (("fresh", fresh_out), ("preloaded", out)):
        for rank in (0, 1):  # as at an interpreter's end: atexit ran, an unclosed file was flushed
            assert (tmp_path / f"atexit-{start}-a0-rank{rank}").read_text() == "ran"
            assert (tmp_path / f"unclosed-{start}-a0-rank{rank}").read_text() == "flushed at exit"
            assert f"[rank{rank}]: " in text and f"start_state warning ({start})" in text


@pytest.mark.timeout(600)
def test_signals_ignored_when_the_launch_began_stay_ignored_in_every_rank_however_it_starts(tmp_path):
    """``nohup python train.py &`` in a script: SIGHUP (nohup) and SIGINT (a background command of a script) are
    ignored when the launching process starts. The launcher keeps them ignored rather than handling them (a hangup
    would stop the run nohup was asked to keep), and every rank sees them ignored, forked or fresh, as an exec of
    the program would (a loaded run started under nohup once found the preloaded ranks ignoring them and the fresh
    ones not: the launcher had replaced them before starting fresh ranks)."""
    for start in ("fresh", "preloaded"):
        run, out = launch(tmp_path, start, ignored=("SIGHUP", "SIGINT"))
        assert run.returncode == 0, out[-3000:]
    for before, after in zip(states(tmp_path, "fresh"), states(tmp_path, "preloaded")):
        assert after["handlers"]["SIGHUP"] == after["handlers"]["SIGINT"] == "<Handlers.SIG_IGN: 1>", after
        assert {key: after[key] for key in SAME} == {key: before[key] for key in SAME}
        assert after["weights"] == before["weights"]


@pytest.mark.timeout(600)
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="torch starts no OpenMP pool with one core")
def test_a_launching_process_with_an_openmp_pool_is_not_forked(tmp_path):
    """A large matmul before train() starts torch's OpenMP threads: a fork of that process would hang at its first
    parallel region, so the preloaded process is a fresh interpreter, and the ranks still match fresh ones."""
    run, out = launch(tmp_path, "preloaded", START_POOL=1)
    assert run.returncode == 0, out[-3000:]
    fresh_run, fresh_out = launch(tmp_path, "fresh", START_POOL=1)
    assert fresh_run.returncode == 0, fresh_out[-3000:]
    for before, after in zip(states(tmp_path, "fresh"), states(tmp_path, "preloaded")):
        assert after["parent_command"][1:3] == ["-m", "torchstage.launch.zygote"]
        assert after["torch._dynamo loaded"] and {key: after[key] for key in SAME} == {key: before[key] for key in SAME}
        assert after["weights"] == before["weights"]


@pytest.mark.timeout(600)
def test_a_program_that_wraps_an_installed_function_is_not_forked(tmp_path):
    """A copy of the launching process would hold the program's wrapper when the program runs again and wraps it a
    second time: the preloaded process is a fresh interpreter instead."""
    run, out = launch(tmp_path, "preloaded", START_PATCH=1)
    assert run.returncode == 0, out[-3000:]
    assert ("forked from a preloaded process (a fresh interpreter: this one cannot be forked: the program replaced "
            "string.capwords with its") in out, out[-3000:]
    for state in states(tmp_path, "preloaded"):
        assert state["capwords"] == "A B!" and state["parent_command"][1:3] == ["-m", "torchstage.launch.zygote"]


@pytest.mark.timeout(600)
def test_a_restarted_world_is_forked_from_the_same_preloaded_process(tmp_path):
    run, out = launch(tmp_path, "preloaded", START_FAIL_ONCE=1)
    assert run.returncode == 0, out[-3000:]
    assert "attempt 1 of 2 failed" in out and "rank 1 fails on its first attempt" in out
    second = states(tmp_path, "preloaded", attempt=1)
    assert all(state["torch._dynamo loaded"] and not state["parent_is_launcher"] for state in second)
    assert second[0]["parent"] == second[1]["parent"]  # one preloaded process for both attempts
    assert out.count("forked from a preloaded process") == 1


def test_an_unknown_start_is_refused_before_any_process_starts(tmp_path):
    run, out = launch(tmp_path, "spawn")
    assert run.returncode == 1
    assert "TORCHSTAGE_START must be 'preloaded'" in out and "got 'spawn'" in out
    assert not list(tmp_path.glob("state-*"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start", ["preloaded", "fresh"])
def test_ranks_still_starting_die_with_a_killed_launcher(tmp_path, start):
    """SIGKILL to the launcher while its ranks run the program's first lines (not yet in their world): no rank, and
    no preloaded process, outlives it; the next launcher of the machine removes the failure folder it left."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = script_env(2, TORCHSTAGE_START=start, SLOW_START_DIR=str(tmp_path), TMPDIR=str(temp))
    launcher = subprocess.Popen([sys.executable, "-c", SLOW_START], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    family = []
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("started-*"))) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        family = descendants(launcher.pid)[1:]  # every process below it
        assert len(family) >= 2
        launcher.kill()
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in family if alive(pid)]
        left = list(temp.glob(f"{PREFIX}*"))
        assert len(left) == 1 and sweep(str(temp), settle=0) == [str(left[0])]
        assert not left[0].exists()
    finally:
        for pid in [launcher.pid, *family]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait()


SLOW_START = """
import os, sys, time
from torchstage import distributed_cmd_run
if os.environ.get("RANK"):
    open(os.path.join(os.environ["SLOW_START_DIR"], f"started-{os.getpid()}"), "w").close()
    time.sleep(120)  # a program's slow first lines, before its world exists
distributed_cmd_run(print)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ending, code, shown", [
    ("sys.exit(3)", 3, None), ("sys.exit('no data on rank 1')", 1, "[rank1]: no data on rank 1"),
    ("raise KeyboardInterrupt", 130, "[rank1]: KeyboardInterrupt"),
    ("os.kill(os.getpid(), signal.SIGKILL)", 137, "was killed by signal 9"),
    ("raise ValueError('bad rank 1')", 1, "[rank1]: ValueError: bad rank 1")])
def test_a_preloaded_rank_ends_with_the_exit_code_a_fresh_one_has(tmp_path, ending, code, shown):
    program = ("import os, signal, sys, time\nfrom torchstage import distributed_cmd_run\n"
               f"def fn():\n    if os.environ['RANK'] == '1':\n        {ending}\n    time.sleep(30)\n"
               "distributed_cmd_run(fn)\n")
    (tmp_path / "ending.py").write_text(program)
    for start in ("preloaded", "fresh"):
        result = subprocess.run([sys.executable, str(tmp_path / "ending.py")], cwd=ROOT, capture_output=True,
                                env=script_env(2, TORCHSTAGE_START=start), text=True, timeout=240)
        out = result.stdout + result.stderr
        assert result.returncode == code, (start, out[-3000:])
        assert shown is None or shown in out, (start, out[-3000:])
        assert "seeded_entry" not in out and "forked_rank" not in out  # the entry's frames are not the user's


def test_a_python_thread_makes_the_launching_process_unsafe_to_fork():
    import threading
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]  # an earlier test's (tqdm's)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="user-thread")
    thread.start()
    try:
        names = ", ".join((others + ["user-thread"])[:4])  # in the order they started
        assert f"{len(others) + 1} Python thread(s) run beside the main one ({names})" in unsafe_to_fork()
    finally:
        stop.set()
        thread.join()
    assert native_threads() >= 1


def test_the_programs_own_modules_run_again_in_a_rank(tmp_path, monkeypatch):
    (tmp_path / "own_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import own_module  # noqa: F401
    try:
        names = local_modules(str(tmp_path))
        assert "own_module" in names
        assert not [name for name in names if name.split(".")[0] in ("torch", "torchstage", "numpy")]
        assert local_modules(str(ROOT)) and "torchstage" not in local_modules(str(ROOT))  # a checkout run from its root
    finally:
        sys.modules.pop("own_module", None)
