"""A rank killed by a signal is named the cause of a failure even where its peer's error (the connection it lost)
is reported first: the preloaded process reports exits in the order it reaps them, not the order they happened."""
import subprocess
import sys
import time

import pytest

from torchstage.launch.local_launcher import Launcher
from torchstage.launch.world import World

pytestmark = pytest.mark.distributed

# rank 1 dies by SIGKILL; rank 0, once rank 1 is dead, fails on the connection it lost and records that as its error
WORKER = """
import json, os, signal, sys, time
rank, folder = int(os.environ["RANK"]), os.environ["TORCHSTAGE_FAILURE_DIR"]
if rank == 1:
    with open(os.path.join(folder, "pid-1"), "w") as f:
        f.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


def dead(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        with open(os.path.join(folder, "pid-1")) as f:
            if dead(int(f.read())):
                break
    except (FileNotFoundError, ValueError):
        pass
    time.sleep(0.01)
record = {"rank": 0, "error": "RuntimeError: Connection closed by peer", "stopped": False, "time": time.time(),
          "position": {"stage": "main", "epoch": 2, "loader": "train", "loader_batch": 4, "global_batch_step": 16}}
with open(os.path.join(folder, "rank-0.json"), "w") as f:
    json.dump(record, f)
sys.exit(1)
"""


class LateExit:
    """A worker whose exit the launcher learns ``delay`` seconds late, as from the preloaded process."""

    def __init__(self, popen, delay):
        self.popen, self.delay, self.known, self.returncode = popen, delay, False, None
        self.stdout, self.stderr, self.pid = popen.stdout, popen.stderr, popen.pid

    def wait(self, timeout=None):
        code = self.popen.wait(timeout)
        if not self.known:
            time.sleep(self.delay)
            self.known = True
        self.returncode = code
        return code

    def poll(self):
        return self.returncode if self.known else None

    def send_signal(self, sig):
        self.popen.send_signal(sig)


class Starter:
    """Starts each worker as a fresh interpreter; rank 1's death is reported late."""

    def start(self, env):
        popen = subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        return LateExit(popen, 0.6 if env["RANK"] == "1" else 0.0)


@pytest.mark.timeout(60)
def test_the_killed_rank_not_its_peers_echo_is_the_cause(tmp_path):
    launcher = Launcher([], World(world_size=2, spawn=2), grace=2, failure_dir=str(tmp_path), starter=Starter())
    code = launcher.run()
    assert code == 128 + 9  # the job ends as the killed rank did
    assert launcher.failed_rank == 1 and launcher.failure is None  # a death without a word: worth a restart


def test_an_error_whose_message_opens_with_a_blank_line_is_recorded_with_its_words_first(tmp_path, monkeypatch):
    """torch's pipeline stage errors open with a newline: the record's first line (what the launcher shows) is
    "RuntimeError: [Stage 0] failed to run forward:", not "RuntimeError: "."""
    from torchstage.launch.failures import FAILURE_DIR_ENV, read_failures, record_failure
    monkeypatch.setenv(FAILURE_DIR_ENV, str(tmp_path))
    record_failure(0, RuntimeError("\n            [Stage 0] failed to run forward:\n            args: ()"), {})
    assert read_failures(str(tmp_path))[0]["error"].splitlines()[0] == "RuntimeError: [Stage 0] failed to run forward:"
