"""MLflow tracking (``pip install 'torchstage[mlflow]'``): one run per job, continued across resumes and requeues.

By default the tracking store is a SQLite database in the logdir (``sqlite:///<logdir>/mlflow.db``) with
artifacts in ``<logdir>/mlflow-artifacts``; open it with
``mlflow ui --backend-store-uri sqlite:///<logdir>/mlflow.db``.
"""
import logging
import os
import socket
import time

from torchstage.callbacks.loggers.logger_base import EPOCH, LoggerCallback
from torchstage.files.reports.plot import plot_logs
from torchstage.version import __version__

logger = logging.getLogger("torchstage")
#: Longest parameter value sent (MLflow refuses longer ones).
MAX_PARAM_LENGTH = 500
_STATUS = {"FINISHED": "FINISHED", "STOPPED": "KILLED", "FAILED": "FAILED"}


class MLflowLogger(LoggerCallback):
    """Params, metrics with steps, tags and artifacts of a run, logged from the main rank only.

    ``tracking_uri``: any MLflow tracking URI (a server, ``sqlite:///...``, ``databricks``); None for the
    SQLite store in the logdir. ``experiment_name`` and ``run_name`` name the run (``run_name`` defaults
    to the logdir's name). ``tags`` are added to the automatic ones (world size, strategy, SLURM job id,
    host, logdir). ``log_checkpoint``: "best", "last" or None, uploaded when the run ends, with the
    curves (``curves.png``, needs matplotlib), ``metrics.json`` and the CSV logs.
    Metric keys are ``<loader>/<metric>`` per epoch (step: global epoch), ``<loader>/batch/<metric>`` per
    ``log_period`` and ``<loader>/periodic/<metric>`` (step: global train batch).
    The run id is saved in checkpoints: ``resume="last"`` or a SLURM requeue continues the same run.
    """

    name = "mlflow"

    def __init__(self, tracking_uri: str = None, experiment_name: str = "torchstage", run_name: str = None,
                 tags: dict = None, log_period=None, log_checkpoint: str = "best"):
        super().__init__(log_period)
        if log_checkpoint not in ("best", "last", None):
            raise ValueError(f"log_checkpoint must be 'best', 'last' or None, got {log_checkpoint!r}")
        if not isinstance(experiment_name, str) or not experiment_name:
            raise ValueError(f"experiment_name must be a non-empty string, got {experiment_name!r}")
        self.tracking_uri, self.experiment_name, self.run_name = tracking_uri, experiment_name, run_name
        self.tags, self.log_checkpoint = dict(tags or {}), log_checkpoint
        self.run_id = self.client = None

    def _open(self, runner):
        if runner.spec.logdir is None:
            raise ValueError("MLflowLogger needs a logdir (its default store, checkpoints and curves live there); "
                             "pass logdir=... to train()")
        from mlflow import MlflowClient  # optional extra, imported when a run starts
        logdir = os.path.abspath(runner.spec.logdir)
        uri = self.tracking_uri or f"sqlite:///{os.path.join(logdir, 'mlflow.db')}"
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            location = None if self.tracking_uri else f"file://{os.path.join(logdir, 'mlflow-artifacts')}"
            experiment_id = self.client.create_experiment(self.experiment_name, artifact_location=location)
        tags = {"world_size": str(runner.engine.world_size), "strategy": _strategy_name(runner.spec.strategy),
                "host": socket.gethostname(), "logdir": logdir, "torchstage.version": _version(), **self.tags}
        job = os.environ.get("SLURM_JOB_ID")
        if job:
            tags["slurm_job_id"] = job
        self.run_id = self.run_id or self._requeued_run(experiment_id, job, logdir)
        if self.run_id is not None and not self._exists(self.run_id):
            logger.warning("MLflow run %s of the checkpoint is not in %s; starting a new run", self.run_id, uri)
            self.run_id = None
        if self.run_id is None:
            run = self.client.create_run(experiment_id, tags=tags,
                                         run_name=self.run_name or os.path.basename(logdir))
            self.run_id = run.info.run_id
        else:
            self.client.update_run(self.run_id, status="RUNNING")
            for key, value in tags.items():
                self.client.set_tag(self.run_id, key, value)
        logger.info("MLflow run %s in %s (mlflow ui --backend-store-uri %s)", self.run_id, uri, uri)

    def _exists(self, run_id) -> bool:
        from mlflow.exceptions import MlflowException  # optional extra
        try:
            self.client.get_run(run_id)
        except MlflowException:
            return False
        return True

    def _requeued_run(self, experiment_id, job, logdir):
        """A SLURM job requeued before its first checkpoint: the run this job already started in this logdir."""
        if not job:
            return None
        runs = self.client.search_runs([experiment_id], f"tags.slurm_job_id = '{job}' and tags.logdir = '{logdir}'",
                                       max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0].info.run_id if runs else None

    def log_hparams(self, hparams, runner):
        self._open(runner)
        from mlflow.entities import Param  # optional extra
        logged = self.client.get_run(self.run_id).data.params
        params = []
        for key, value in hparams.items():
            text = str(value)[:MAX_PARAM_LENGTH]
            if key not in logged:
                params.append(Param(key, text))
            elif logged[key] != text:  # MLflow params are immutable: a resumed run keeps the first value
                logger.warning("MLflow param %r was %r and is now %r; keeping the first", key, logged[key], text)
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per call
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def log_metrics(self, metrics, step, loader, scope, runner):
        from mlflow.entities import Metric  # optional extra
        prefix = f"{loader}/" if scope == EPOCH else f"{loader}/{scope}/"
        now = int(time.time() * 1000)
        batch = [Metric(f"{prefix}{key}", float(value), now, int(step))
                 for key, value in metrics.items() if isinstance(value, (int, float))]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def log_artifact(self, path, runner, kind="file"):
        if self.run_id is not None and os.path.exists(path):
            self.client.log_artifact(self.run_id, path, artifact_path=kind)

    def close(self, runner, status):
        if self.run_id is None or self.client is None:
            return
        if status != "FAILED":
            self._upload_results(runner)
        self.client.set_terminated(self.run_id, _STATUS[status])
        self.client = None  # a new process (resume) opens it again

    def _upload_results(self, runner):
        logdir = runner.spec.logdir
        if runner.file_writer is not None:  # the checkpoints and log rows handed over have landed
            runner.file_writer.wait()
        if self.log_checkpoint:
            self.log_artifact(os.path.join(logdir, "checkpoints", f"{self.log_checkpoint}.pth"), runner, "checkpoint")
        self.log_artifact(os.path.join(logdir, "checkpoints", "metrics.json"), runner, "logs")
        logs = os.path.join(logdir, "logs")
        if os.path.isdir(logs):
            self.client.log_artifacts(self.run_id, logs, artifact_path="logs")
        try:
            self.log_artifact(plot_logs(logdir), runner, "plot")
        except (ImportError, OSError, ValueError) as exc:
            logger.info("MLflow: no curves.png uploaded (%s)", exc)

    def state_dict(self):
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state):
        self.run_id = state.get("run_id")


def _version() -> str:
    return __version__


def _strategy_name(strategy) -> str:
    """The name ``train(strategy=...)`` takes for it (``"ddp"``), else its class name."""
    return getattr(strategy, "name", None) or type(strategy).__name__
