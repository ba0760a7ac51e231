"""Hyperparameter search with Optuna over the trials of a ``train()`` config (``torchstage tune``).

The config is a ``torchstage run`` config plus a ``tune:`` section::

    tune:
      n_trials: 20
      study_name: regression            # default: "torchstage"
      storage: sqlite:///tune.db        # any Optuna RDB URL; default: sqlite:///<logdir>/study.db
      sampler: {_target_: optuna.samplers.TPESampler, seed: 0}
      pruner: {_target_: optuna.pruners.MedianPruner, n_warmup_steps: 2}
      params:                           # config path -> search space
        optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
        datasets.batch_size: {type: categorical, choices: [16, 32, 64]}

Each trial trains the config with its parameters set, in ``<logdir>/trial-NNNN``, and reports the
validation metric every epoch (:class:`~torchstage.callbacks.control.optuna_pruning.OptunaPruningCallback`); its
objective is the best value reached. With ``distributed: true`` the processes start once for the whole
study: the main rank asks the study for each trial and broadcasts its parameters, every rank trains the
same trial, and pruning decisions are the main rank's. The storage keeps finished trials, so running the
same command again continues the study up to ``n_trials`` finished trials; a trial an interruption left
running is marked failed and its parameters are tried again.
"""
import copy
import json
import logging
import os
from collections.abc import Mapping

from torchstage.callbacks.control.optuna_pruning import OptunaPruningCallback
from torchstage.config.schema import check_config
from torchstage.config.train_call import train_from_config, with_defaults
from torchstage.config.yaml_files import apply_override
from torchstage.launch.enter import current_world, distributed_cmd_run
from torchstage.distributed.engine import Engine
from torchstage.config.instantiate import TARGET, ConfigError, import_target, instantiate, is_component, join

logger = logging.getLogger("torchstage")
PARAM_TYPES = {"float": ("low", "high", "log", "step"), "int": ("low", "high", "log", "step"),
               "categorical": ("choices",)}
SETTINGS = ("n_trials", "study_name", "storage", "sampler", "pruner", "params", "direction")


def tune(config: Mapping, n_trials: int = None, storage: str = None, study_name: str = None):
    """Run (or continue) the study of ``config`` (a train config with a ``tune:`` section, see module doc).

    ``n_trials``, ``storage`` and ``study_name`` override the section's. Returns the ``optuna.Study`` on
    the main rank (None on the others). With several processes this starts them like
    :func:`~torchstage.distributed_cmd_run` and ends the launching process with their exit code.
    """
    config, settings = split_config(config)
    settings.update({k: v for k, v in (("n_trials", n_trials), ("storage", storage), ("study_name", study_name))
                     if v is not None})
    check_settings(settings, config)
    check_targets(config, settings)
    return distributed_cmd_run(_run_study, config, settings, distributed=config.get("distributed") is not False,
                               nprocs=config.get("nprocs"))


def split_config(config: Mapping) -> tuple:
    """``(train config, tune settings)``; raises ConfigError without a ``tune:`` section."""
    config = dict(config)
    settings = config.pop("tune", None)
    if not isinstance(settings, Mapping):
        raise ConfigError("tune", f"expected a mapping with n_trials and params (see docs/integrations.md), "
                                  f"got {settings!r:.60}")
    return config, dict(settings)


def check_settings(settings: dict, config: Mapping) -> None:
    """Raise ConfigError naming ``tune.<key>`` for anything malformed, before a trial starts."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"tune.{unknown[0]}", f"unknown key; expected one of {list(SETTINGS)}")
    n = settings.get("n_trials")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError("tune.n_trials", f"expected an integer >= 1, got {n!r}")
    if settings.get("storage") is None and config.get("logdir") is None:
        raise ConfigError("tune.storage", "no storage and no logdir: give tune.storage (e.g. sqlite:///study.db) or "
                                          "a logdir (the study goes to <logdir>/study.db)")
    if config.get("logdir") is None:
        raise ConfigError("logdir", "tune needs a logdir: each trial trains in <logdir>/trial-NNNN")
    params = settings.get("params")
    if not isinstance(params, Mapping) or not params:
        raise ConfigError("tune.params", f"expected a mapping of config path -> search space, got {params!r:.60}")
    for key, space in params.items():
        where = f"tune.params.{key}"
        if not isinstance(space, Mapping) or space.get("type") not in PARAM_TYPES:
            raise ConfigError(where, f"expected {{type: float|int|categorical, ...}}, got {space!r:.60}")
        allowed = PARAM_TYPES[space["type"]]
        extra = sorted(set(space) - {"type", *allowed})
        if extra:
            raise ConfigError(f"{where}.{extra[0]}", f"not an argument of a {space['type']} space; expected {allowed}")
        needed = ("choices",) if space["type"] == "categorical" else ("low", "high")
        for name in needed:
            if name not in space:
                raise ConfigError(where, f"a {space['type']} space needs {name}")
    for name in ("sampler", "pruner"):
        if settings.get(name) is not None and not is_component(settings[name]):
            raise ConfigError(f"tune.{name}", f"expected {{_target_: optuna.{name}s...}}, got {settings[name]!r:.60}")


def check_targets(config: Mapping, settings: Mapping = None) -> None:
    """The config's keys and types, and every ``_target_`` imported (nothing built; the tune section's sampler and
    pruner too), before the study starts: a mistake is a ConfigError with its YAML path, never a failed trial."""
    check_config(with_defaults(config))

    def walk(node, path):
        if isinstance(node, Mapping):
            if is_component(node):
                import_target(node[TARGET], path, {key: value for key, value in node.items() if key != TARGET})
            for key, value in node.items():
                if key != TARGET:
                    walk(value, join(path, key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, join(path, index))
    walk(config, "")
    for name in ("sampler", "pruner"):
        walk((settings or {}).get(name), f"tune.{name}")


def suggest(trial, params: Mapping) -> dict:
    """The trial's value for each config path, drawn from its search space."""
    values = {}
    for key, space in params.items():
        kwargs = {k: v for k, v in space.items() if k != "type"}
        values[key] = getattr(trial, f"suggest_{space['type']}")(key, **kwargs)
    return values


def with_params(config: Mapping, values: Mapping, logdir: str) -> dict:
    """A copy of ``config`` with each ``a.b.c`` path set to its value and the trial's logdir."""
    config = copy.deepcopy(dict(config))
    for key, value in values.items():
        apply_override(config, f"{key}={json.dumps(value)}")
    config["logdir"] = logdir
    return config


def _run_study(config: dict, settings: dict):
    """The study loop, on every rank of the world (or the only process); the main rank drives Optuna."""
    world = current_world()
    engine = Engine.for_world(world) if world.is_distributed else Engine(device="cpu")  # for its collectives
    base = os.fspath(config["logdir"])
    if not engine.is_main:
        while True:  # train whatever the main rank proposes, until it says the study is done
            proposal = engine.broadcast_object(None)
            if proposal is None:
                return None
            try:
                _run_trial(config, base, proposal, None)
            except _pruned_error():
                pass

    def objective(trial):
        proposal = {"number": trial.number, "params": suggest(trial, settings["params"])}
        engine.broadcast_object(proposal)  # every rank trains the main rank's parameters
        return _run_trial(config, base, proposal, trial)

    study = _load_study(config, settings)
    try:
        remaining = settings["n_trials"] - len(_finished(study))
        if remaining > 0:
            study.optimize(objective, n_trials=remaining)
        logger.info("optuna: study %r has %d finished trials (n_trials=%d)", study.study_name,
                    len(_finished(study)), settings["n_trials"])
    finally:
        engine.broadcast_object(None)
    return study


def _pruned_error():
    import optuna  # an optional extra: pip install torchstage[optuna]
    return optuna.TrialPruned


def _finished(study) -> list:
    import optuna  # an optional extra: pip install torchstage[optuna]
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))


def _load_study(config: dict, settings: dict):
    import optuna  # an optional extra: pip install torchstage[optuna]
    storage = settings.get("storage") or f"sqlite:///{os.path.abspath(os.path.join(config['logdir'], 'study.db'))}"
    if storage.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(storage[len("sqlite:///"):])) or ".", exist_ok=True)
    direction = settings.get("direction") or ("minimize" if config.get("minimize_valid_metric", True) else "maximize")
    study = optuna.create_study(
        storage=storage, study_name=settings.get("study_name", "torchstage"), direction=direction,
        load_if_exists=True, sampler=instantiate(settings["sampler"], "tune.sampler") if settings.get("sampler") else None,
        pruner=instantiate(settings["pruner"], "tune.pruner") if settings.get("pruner") else None)
    interrupted = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for frozen in interrupted:  # left running by an interrupted tune: failed, and tried again first
        study._storage.set_trial_state_values(frozen._trial_id, optuna.trial.TrialState.FAIL)
        study.enqueue_trial(frozen.params, user_attrs={"retry_of": frozen.number})
        logger.info("optuna: trial %d was interrupted; marked failed, its parameters will run again", frozen.number)
    return study


def _run_trial(config: dict, base: str, proposal: dict, trial) -> float:
    """Train one trial on this rank; returns the best validation value, raises ``optuna.TrialPruned``."""
    number, params = proposal["number"], proposal["params"]
    logdir = os.path.join(base, f"trial-{number:04d}")
    if trial is not None:
        logger.info("optuna: trial %d in %s with %s", number, logdir, params)
    pruning = OptunaPruningCallback(trial)
    train_from_config(with_params(config, params, logdir), callbacks={"optuna": pruning})
    if pruning.best is None:
        raise RuntimeError(f"trial {number} reported no validation value: did the valid loader run?")
    return pruning.best
