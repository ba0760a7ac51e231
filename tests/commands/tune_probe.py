"""A callback for the tune tests: each rank records the parameters it trained with; it can kill a trial."""
import json
import os
import signal

from torchstage import Callback


class ParamsProbe(Callback):
    """Writes ``<trial logdir>/params-rank<R>.json`` (lr, batch size, world size); with ``KILL_IN_TRIAL=n``
    SIGKILLs the process at the start of epoch 2 of trial n."""

    order = 300

    def on_experiment_start(self, runner):
        logdir = runner.spec.logdir
        os.makedirs(logdir, exist_ok=True)  # the main rank may not have created it yet
        loader = runner.loaders["train"]
        with open(os.path.join(logdir, f"params-rank{runner.engine.rank}.json"), "w") as f:
            json.dump({"lr": runner.optimizer.param_groups[0]["lr"], "batch_size": loader.batch_size,
                       "world_size": runner.engine.world_size}, f)

    def on_epoch_start(self, runner):
        kill = os.environ.get("KILL_IN_TRIAL")
        if kill and runner.epoch == 2 and os.path.basename(runner.spec.logdir) == f"trial-{int(kill):04d}":
            os.kill(os.getpid(), signal.SIGKILL)
