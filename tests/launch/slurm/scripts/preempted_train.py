"""scripts/slurm_train.py with a pause for the preemption test: python preempted_train.py LOGDIR [PAUSE_AT].

In the first run of a SLURM job (SLURM_RESTART_COUNT unset or 0) the main rank writes LOGDIR/paused
after train batch PAUSE_AT and waits there, at most 60 s, until a stop is requested (the test sends
`scancel -s USR1`), so the signal lands after exactly that batch whatever the machine's speed, and
every rank stops after the next one (``StopCallback(check_every=1)``: the ranks' agreement runs during it;
by default they agree about every 0.5 s, so the batch would depend on the machine's speed). The other ranks wait
in that batch's gradient all-reduce. A requeued run does not pause.
USR1_STOPS=1 makes SIGUSR1 stop the run outside SLURM too (where no requeue callback catches it).
"""
import os
import runpy
import sys
import signal
import time

from torchstage import Callback, StopCallback
from torchstage.stop_request import stop_requested

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


class PauseAt(Callback):
    order = 9_000  # before the stop callback checks for a request

    def __init__(self, logdir, batch):
        self.marker, self.batch = os.path.join(logdir, "paused"), batch

    def on_batch_end(self, runner):
        if not (runner.engine.is_main and runner.is_train_loader and runner.global_batch_step == self.batch):
            return
        open(self.marker, "w").close()
        deadline = time.monotonic() + 60
        while stop_requested() is None and time.monotonic() < deadline:
            time.sleep(0.05)


if __name__ == "__main__":
    logdir, pause_at = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    first_run = os.environ.get("SLURM_RESTART_COUNT", "0") in ("", "0")
    main = runpy.run_path(os.path.join(REPO, "scripts", "slurm_train.py"))["main"]
    callbacks = [PauseAt(logdir, pause_at)] if pause_at and first_run else []
    usr1 = (signal.SIGUSR1,) if os.environ.get("USR1_STOPS") == "1" else ()
    callbacks.append(StopCallback(signals=(signal.SIGTERM, signal.SIGINT, *usr1), check_every=1))
    main(logdir, callbacks=callbacks)
