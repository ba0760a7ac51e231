"""``torchstage run``: train from YAML configs, the same ``train(...)`` call a script makes."""
import argparse
import contextlib
import logging
import os
import sys

from torchstage.config.train_call import train_from_config, with_defaults
from torchstage.config.yaml_files import add_import_paths, dump_config, load_config
from torchstage.config.instantiate import ALLOWED_TARGETS_VAR, ConfigError
from torchstage.logging_setup import at_level, ensure_console_handler
from torchstage.runner.chain import describe_chain
from torchstage.runner.errors import LogdirHoldsRun

DESCRIPTION = """\
Build the runner, model, criterion, optimizer, scheduler, data and callbacks from YAML
and call runner.train(...) with them. Files are merged in order (later keys win), then
--set overrides apply. Components are named by import path: {_target_: torch.nn.Linear,
in_features: 10, out_features: 1}. See docs/config.md."""

EPILOG = """\
examples:
  torchstage run -C scripts/configs/regression.yml
  torchstage run -C base.yml fast.yml --set optimizer.lr=1e-3 --set num_epochs=3
  torchstage run -C logdir/config.yml --set logdir=logdir2    # repeat a run
  torchstage run -C base.yml --dry-run                        # check and show, train nothing
  torchrun --nproc_per_node 2 -m torchstage run -C ddp.yml    # one process per rank

modules named by _target_ are imported from each config file's folder and the current directory.

exit status: 0 on success, 2 on a config error (the message names its YAML path) or any other
user error found before or at the first batch (one line on stderr, no traceback)."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="train from YAML config files", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-C", "--config", nargs="+", action="extend", required=True, metavar="FILE",
                        help="YAML config file(s), merged left to right; may be repeated")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override one key after merging, VALUE parsed as YAML (e.g. --set "
                             "stages.finetune.optimizer.lr=1e-4); may be repeated")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the merged config and the callback chain of each stage, build every "
                             "component, and exit without training")
    add_allow_targets_argument(parser)
    parser.set_defaults(func=run_command)


def add_allow_targets_argument(parser) -> None:
    """``--allow-targets``, for every command that builds components from a config (run, tune)."""
    parser.add_argument("--allow-targets", metavar="PREFIXES",
                        help="comma-separated module prefixes every _target_ must start with (e.g. "
                             "torch,torchstage,mypkg); anything else is refused before it is imported, and so is "
                             "what reads files as code or starts processes even below them (docs/config.md). A "
                             "config is code: only run configs you trust")


def apply_allow_targets(args) -> None:
    """The allow-list of ``--allow-targets`` for this process and the training processes it starts."""
    if args.allow_targets:
        os.environ[ALLOWED_TARGETS_VAR] = args.allow_targets


def run_command(args) -> int:
    add_import_paths(args.config)
    apply_allow_targets(args)
    try:
        config = load_config(args.config, args.overrides)
        if not args.dry_run:
            train_from_config(config)
            return 0
        sys.stdout.write("# merged config\n" + dump_config(with_defaults(config)))
        with _quiet_logger():  # the chains are printed below, for every stage
            runner = train_from_config(config, dry_run=True)
    except ConfigError as exc:
        sys.stderr.write(f"torchstage run: error: {exc}\n")
        return 2
    except LogdirHoldsRun as exc:  # its fixes in --set options
        sys.stderr.write(f"torchstage run: error: {exc.text(cli=True)}\n")
        return 2
    for stage, loaders, chain in zip(runner.spec.stage_specs, runner.stage_loaders, runner.stage_callbacks):
        sys.stdout.write(f"\n# stage {stage.name!r}: {stage.num_epochs} epoch(s); "
                         f"loaders {', '.join(f'{k} ({_batches(v)} batches)' for k, v in loaders.items())}; "
                         f"criterion {_kind(stage.criterion)}; optimizer {_kind(stage.optimizer)}; "
                         f"scheduler {_kind(stage.scheduler)}\n# callbacks:\n{describe_chain(chain)}\n")
    sys.stdout.write("\ndry run: every component was built; nothing was trained\n")
    return 0


def _batches(loader) -> str:
    try:
        return str(len(loader))
    except TypeError:
        return "?"


def _kind(component) -> str:
    if isinstance(component, dict):
        return "{" + ", ".join(f"{k}: {type(v).__name__}" for k, v in component.items()) + "}"
    return "none" if component is None else type(component).__name__


@contextlib.contextmanager
def _quiet_logger():
    ensure_console_handler()
    with at_level("torchstage", logging.WARNING):
        yield
