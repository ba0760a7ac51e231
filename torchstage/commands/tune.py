"""``torchstage tune``: an Optuna study over the trials of a ``torchstage run`` config (see torchstage/config/tuning.py)."""
import argparse
import logging
import sys

from torchstage.commands.run import add_allow_targets_argument, apply_allow_targets
from torchstage.config.yaml_files import add_import_paths, load_config
from torchstage.config.instantiate import ConfigError
from torchstage.logging_setup import ensure_console_handler
from torchstage.config.tuning import tune

DESCRIPTION = """\
Search hyperparameters with Optuna: each trial trains the config (as `torchstage run` would)
with the values of tune.params set, in <logdir>/trial-NNNN, reporting the validation metric
every epoch to the study's pruner. The study lives in tune.storage (an Optuna RDB URL;
default sqlite:///<logdir>/study.db); running the command again continues it up to
n_trials finished trials. With `distributed: true` every trial runs on all processes with
the main rank's parameters. See docs/integrations.md."""

EPILOG = """\
examples:
  torchstage tune -C scripts/configs/regression.yml scripts/configs/tune.yml
  torchstage tune -C regression.yml tune.yml --n-trials 50 --storage postgresql://user@host/db
  torchstage tune -C regression.yml tune.yml distributed.yml   # 2 processes per trial

exit status: 0 when the study has n_trials finished trials, 2 on a config error."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "tune", help="search hyperparameters with Optuna", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-C", "--config", nargs="+", action="extend", required=True, metavar="FILE",
                        help="YAML config file(s) with a tune: section, merged left to right")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override one key after merging (e.g. --set tune.n_trials=10); may be repeated")
    parser.add_argument("--n-trials", type=int, default=None, help="finished trials to reach (tune.n_trials)")
    parser.add_argument("--storage", default=None, help="Optuna storage URL (tune.storage)")
    parser.add_argument("--study-name", default=None, help="study name (tune.study_name)")
    add_allow_targets_argument(parser)
    parser.set_defaults(func=tune_command)


def tune_command(args) -> int:
    ensure_console_handler()
    add_import_paths(args.config)  # modules beside a config, as torchstage run finds them
    apply_allow_targets(args)
    try:
        config = load_config(args.config, args.overrides)
        study = tune(config, n_trials=args.n_trials, storage=args.storage, study_name=args.study_name)
    except ConfigError as exc:
        sys.stderr.write(f"torchstage tune: error: {exc}\n")
        return 2
    if study is not None:
        best = [t for t in study.trials if t.value is not None]
        if best:
            logging.getLogger("torchstage").info("optuna: best trial %d: value %s, params %s", study.best_trial.number,
                                                 study.best_value, study.best_params)
    return 0
