"""The tests' scripts forked from a preloaded process start as a fresh interpreter would: the same view of
themselves, output, exit codes and timeouts as ``subprocess.run`` gives."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import script_server
from tests.helpers import ROOT, alive, script_env

PROGRAM = """
import json, os, random, sys
import numpy, torch
print(json.dumps({"argv": sys.argv, "orig_argv": sys.orig_argv, "file": __file__, "name": __name__,
                  "path0": sys.path[0], "cwd": os.getcwd(), "env": os.environ.get("ASKED"),
                  "parent_env": os.environ.get("TORCHSTAGE_PARENT_PID"), "ppid_alive": os.getppid() > 1,
                  "torch": torch.rand(2).tolist(), "numpy": numpy.random.rand(2).tolist(), "random": random.random(),
                  "threads": torch.get_num_threads()}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("CODE", "0")))
"""


def both(tmp_path, *args, **env):
    """The program run forked and fresh, with the same arguments and environment."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    command = [sys.executable, script, *args]
    full = script_env(**env)
    return (script_server.run(command, env=full, cwd=tmp_path, timeout=60),
            script_server.run(command, env=full, cwd=tmp_path, timeout=60, fresh=True))


def seen(result) -> dict:
    import json
    return json.loads(result.stdout.splitlines()[-1])


def test_a_forked_script_sees_itself_as_a_fresh_interpreter_does(tmp_path):
    forked, fresh = both(tmp_path, "a", "b c", ASKED="yes", CODE=3, OMP_NUM_THREADS=1)
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) == (3, "to stderr\n")
    mine, theirs = seen(forked), seen(fresh)
    for key in ("argv", "orig_argv", "file", "name", "path0", "cwd", "env", "parent_env", "ppid_alive", "threads"):
        assert mine[key] == theirs[key], key
    assert mine["argv"][1:] == ["a", "b c"] and mine["env"] == "yes" and mine["parent_env"] is None
    assert mine["threads"] == 1  # OMP_NUM_THREADS applies, as torch's own start-up would apply it
    assert script_server._servers, "the script was not forked: no preloaded process was made"


def test_each_forked_script_draws_its_own_random_numbers(tmp_path):
    first, second = (seen(both(tmp_path)[0]) for _ in range(2))
    for generator in ("torch", "numpy", "random"):
        assert first[generator] != second[generator], generator


def test_modules_run_with_minus_m_and_code_with_minus_c_as_python_runs_them(tmp_path):
    env = script_env()
    for command in ([sys.executable, "-m", "torchstage.launch.seeded_entry", "-c", "print('hi')"],
                    [sys.executable, "-c", "import sys; print(sys.argv)", "x"]):
        forked = script_server.run(command, env=env, cwd=ROOT, timeout=60)
        fresh = script_server.run(command, env=env, cwd=ROOT, timeout=60, fresh=True)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_an_error_and_a_signal_end_the_script_as_they_end_an_interpreter(tmp_path):
    env = script_env()
    raising = [sys.executable, "-c", "raise ValueError('bad value')"]
    forked = script_server.run(raising, env=env, timeout=60)
    assert forked.returncode == 1 and forked.stderr.rstrip().endswith("ValueError: bad value")
    assert "forked_rank" not in forked.stderr and "seeded_entry" not in forked.stderr
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]
    assert script_server.run(killed, env=env, timeout=60).returncode == -signal.SIGTERM


def test_merged_output_keeps_the_order_and_a_timeout_ends_the_script(tmp_path):
    env = script_env()
    code = "import sys\nfor i in range(3):\n    print(i, flush=True); print('e', i, file=sys.stderr, flush=True)"
    merged = script_server.run([sys.executable, "-c", code], env=env, timeout=60, merge=True)
    assert (merged.stdout, merged.stderr) == ("0\ne 0\n1\ne 1\n2\ne 2\n", None)
    pid_file = tmp_path / "pid"
    sleeper = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                                     "print('waiting', flush=True); time.sleep(600)"]
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        script_server.run(sleeper, env=env, timeout=5)
    assert expired.value.output == "waiting\n"
    pid = int(pid_file.read_text())
    assert script_server.run([sys.executable, "-c", "print(1)"], env=env, timeout=60).stdout == "1\n"
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_a_script_whose_start_up_environment_differs_gets_a_preloaded_process_of_its_own(tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "only_here.py").write_text("WHERE = 'extra'\n")
    env = script_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(extra)]))
    result = script_server.run([sys.executable, "-c", "import only_here; print(only_here.WHERE)"], env=env,
                               timeout=60)
    assert result.stdout == "extra\n", result.stderr


def test_scripts_from_several_threads_are_forked_side_by_side(tmp_path):
    """Threads (a fixture's thread pool) run their scripts at once, each forked, each getting its own output and
    exit code; a thread's timeout ends only its own script."""
    from concurrent.futures import ThreadPoolExecutor
    env = script_env()
    assert script_server.run([sys.executable, "-c", "pass"], env=env, timeout=60).returncode == 0  # made here
    started = tmp_path / "started"
    started.mkdir()
    # each waits until all four have started: they run side by side, not one after another
    code = ("import os, sys, time\nopen(os.path.join(sys.argv[1], sys.argv[2]), 'w').close()\n"
            "while len(os.listdir(sys.argv[1])) < 4: time.sleep(0.05)\n"
            "print(sys.argv[2], 'torch' in sys.modules)\nsys.exit(int(sys.argv[2]))")

    def one(index):
        return script_server.run([sys.executable, "-c", code, started, str(index)], env=env, timeout=120)

    def late():
        with pytest.raises(subprocess.TimeoutExpired):
            script_server.run([sys.executable, "-c", "import time; time.sleep(600)"], env=env, timeout=3)

    with ThreadPoolExecutor(max_workers=5) as pool:
        sleeping = pool.submit(late)
        results = list(pool.map(one, range(4)))
        sleeping.result()
    # torch loaded before the script's first line: forked from the preloaded process, not a fresh interpreter
    assert [(r.returncode, r.stdout) for r in results] == [(i, f"{i} True\n") for i in range(4)]


def test_a_preloaded_process_made_for_a_pool_thread_outlives_the_thread(tmp_path, monkeypatch):
    """A fixture's pool thread may be the first to run a script: the preloaded process it gets is not tied to that
    thread (PDEATHSIG would end it with the thread), so the next script is forked from the same one."""
    from concurrent.futures import ThreadPoolExecutor
    monkeypatch.setattr(script_server, "_servers", {})  # this test's own preloaded processes, whatever ran before
    env = script_env()
    parent = [sys.executable, "-c", "import os; print(os.getppid())"]
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            first = pool.submit(script_server.run, parent, env, None, 60).result()
        second = script_server.run(parent, env=env, timeout=60)  # the pool's thread has ended
        assert first.stdout == second.stdout != f"{os.getpid()}\n", (first, second)  # one preloaded process's children
    finally:
        for server in script_server._servers.values():
            server.close()


WAITER = """
import os, sys, time
def waiting_in_the_child():
    time.sleep(120)
print(os.getpid(), flush=True)
waiting_in_the_child()
"""


@pytest.mark.parametrize("how", ["forked", "fresh", "below a shell"])
def test_a_script_past_its_timeout_shows_where_its_processes_waited_and_leaves_none(tmp_path, how):
    """The failure of a hang says where every process of it waited (read with py-spy before the kill), as an
    mpirun's ranks below it would, and no process of it outlives the test."""
    (tmp_path / "waiter.py").write_text(WAITER)
    command = [sys.executable, str(tmp_path / "waiter.py")]
    if how == "below a shell":  # not a Python script itself: its Python child is found below it
        command = ["bash", "-c", f"{command[0]} {command[1]} & wait"]
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        script_server.run(command, env=script_env(), timeout=8, fresh=how != "forked")
    message = str(raised.value)
    assert "timed out after 8 seconds" in message and "waiting_in_the_child" in message, message
    assert "waiter.py" in message.split("the stacks when it was stopped:")[1], message
    pid, deadline = int(raised.value.output.split()[0]), time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:  # SIGKILL sent: its end is the kernel's, a moment later
        time.sleep(0.05)
    assert not alive(pid)


def test_past_the_most_preloaded_processes_the_least_recently_used_idle_one_makes_room(monkeypatch):
    """However many start-up environments the tests before it used in this worker, a script is forked, not started
    fresh (which a test of forking would see as a failure that depends on the test order)."""
    monkeypatch.setattr(script_server, "_servers", {})
    monkeypatch.setattr(script_server, "MAX_SERVERS", 1)
    code = [sys.executable, "-c", "import sys; print('torch' in sys.modules)"]
    first = script_server.run(code, env=script_env(PYTHONHASHSEED="1"), timeout=120)
    (made,) = script_server._servers.values()
    second = script_server.run(code, env=script_env(PYTHONHASHSEED="2"), timeout=120)
    try:
        assert (first.stdout, second.stdout) == ("True\n", "True\n")  # both forked from a preloaded process
        assert not made.alive() and len(script_server._servers) == 1  # the first one ended to make room
    finally:
        for server in script_server._servers.values():
            server.close()
