"""What a rank sees at its program's first line and after training, for the rank-start tests.

Usage: python start_state.py OUTDIR. Each rank writes OUTDIR/state-<start>-a<attempt>-rank<R>.json (start: the
rank's TORCHSTAGE_START, "preloaded" by default); the launching process, before train(), sets a handler of its own
for SIGUSR2 (a rank must not inherit it), and with START_POOL=1 runs a large matmul (torch's OpenMP threads start:
it must not be forked); with START_PATCH=1 it wraps string.capwords. START_FAIL_ONCE=1: rank 1 fails at the end of its first attempt (max_restarts=1).
"""
import sys

_FIRST = {"torch._dynamo loaded": "torch._dynamo" in sys.modules}  # preloaded ranks start with it imported

import atexit  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import start_helper  # noqa: E402 (a module of the program's own folder, drawing a number when imported)
from torchstage import Callback, SupervisedRunner  # noqa: E402

outdir = sys.argv[1]
start = os.environ.get("TORCHSTAGE_START", "preloaded")
rank, attempt = os.environ.get("RANK"), os.environ.get("TORCHSTAGE_RESTART_COUNT", "0")
handlers = {name: repr(signal.getsignal(getattr(signal, name))) for name in
            ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGPIPE", "SIGHUP")}
_FIRST.update(
    python_threads=[t.name for t in threading.enumerate()], cuda_initialized=torch.cuda.is_initialized(),
    num_threads=torch.get_num_threads(), initial_seed=torch.initial_seed(), torch_rand=torch.rand(3).tolist(),
    python_random=random.random(), numpy_random=np.random.rand(2).tolist(), helper_draw=start_helper.DRAW,
    handlers=handlers, stdout=[sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding],
    stderr=[sys.stderr.line_buffering, sys.stderr.write_through], name=__name__, argv=sys.argv[1:],
    orig_argv=sys.orig_argv,
    parent=os.getppid(), parent_is_launcher=os.getppid() == int(os.environ.get("LAUNCHER_PID", "0")),
    parent_command=open(f"/proc/{os.getppid()}/cmdline").read().split("\0"))
if os.environ.get("START_PATCH"):  # the program wraps a function of a module it did not write
    import string
    _capwords = string.capwords
    string.capwords = lambda text, sep=None: _capwords(text, sep) + "!"
_FIRST["capwords"] = __import__("string").capwords("a b")  # "A B!" when wrapped once
if rank is None:  # the launching process
    os.environ["LAUNCHER_PID"] = str(os.getpid())
    signal.signal(signal.SIGUSR2, lambda signum, frame: None)
    if os.environ.get("START_POOL"):
        torch.rand(1000, 1000) @ torch.rand(1000, 1000)
warnings.warn(f"start_state warning ({start})")


class Record(Callback):
    def on_experiment_end(self, runner):
        if os.environ.get("START_FAIL_ONCE") and attempt == "0" and runner.engine.rank == 1:
            raise RuntimeError("rank 1 fails on its first attempt")
        path = os.path.join(outdir, f"state-{start}-a{attempt}-rank{runner.engine.rank}.json")
        weights = {name: value.tolist() for name, value in runner.unwrapped_model.state_dict().items()}
        with open(path, "w") as out:
            json.dump({**_FIRST, "weights": weights, "world_size": runner.engine.world_size}, out)


def leave_a_mark():
    with open(os.path.join(outdir, f"atexit-{start}-a{attempt}-rank{rank}"), "w") as out:
        out.write("ran")


atexit.register(leave_a_mark)
unclosed = open(os.path.join(outdir, f"unclosed-{start}-a{attempt}-rank{rank}"), "w")
unclosed.write("flushed at exit")  # never closed: the interpreter's end flushes it
X, y = torch.rand(256, 6), torch.rand(256, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=32, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
             loaders={"train": loader, "valid": loader}, num_epochs=2, logdir=os.path.join(outdir, f"logs-{start}"),
             callbacks=[Record()], distributed=True, seed=3, overwrite=attempt == "0", verbose=False,
             max_restarts=1 if os.environ.get("START_FAIL_ONCE") else 0)
