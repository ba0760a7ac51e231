"""``torchstage plan -C config.yml``: each rank's memory for the config's strategy and world, before launch: the model
is built on the meta device (no memory), and no process starts."""
import argparse
import sys

import torch

from torchstage.commands.run import add_allow_targets_argument, apply_allow_targets
from torchstage.config.components import build_models
from torchstage.config.instantiate import ConfigError
from torchstage.config.train_call import build_train_call, with_defaults
from torchstage.config.yaml_files import add_import_paths, load_config
from torchstage.runner.large_models import memory_plan
from torchstage.runner.spec import make_spec

DESCRIPTION = """\
Print each rank's parameters, gradients, optimizer state, activations and working buffers (MiB) for
the config's strategy on a world of --nprocs processes, and the estimated peak. The model is built on
the meta device (shapes only), the strategy's own sharding runs in a fake world inside this process,
and one forward of the first train batch counts what autograd keeps. See docs/large-models.md."""

EPILOG = """\
examples:
  torchstage plan -C model.yml --nprocs 8
  torchstage plan -C model.yml --nprocs 16 --node-size 8 --set strategy=hsdp
  torchstage plan -C model.yml --set activation_checkpointing._target_=... --device cuda"""


def add_parser(subparsers) -> None:
    """Register ``torchstage plan``."""
    parser = subparsers.add_parser("plan", help="print each rank's memory before launching a run",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-C", "--config", nargs="+", action="extend", required=True, metavar="FILE",
                        help="YAML config file(s), merged left to right, as torchstage run takes them")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override one key after merging (e.g. --set strategy=fsdp)")
    parser.add_argument("--nprocs", type=int, default=None,
                        help="the processes of the planned world (default: the config's nprocs, else one)")
    parser.add_argument("--node-size", type=int, default=None, help="processes per node (default: all on one)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="the device the run trains on (default: CUDA where this machine has it)")
    add_allow_targets_argument(parser)
    parser.set_defaults(func=run_plan)


def run_plan(args) -> int:
    """Print the plan, or one line on stderr and exit status 2 for a config that cannot be planned."""
    add_import_paths(args.config)
    apply_allow_targets(args)
    if args.nprocs is not None and args.nprocs < 1:
        sys.stderr.write(f"torchstage plan: error: --nprocs must be >= 1, got {args.nprocs}\n")
        return 2
    try:
        config = with_defaults(load_config(args.config, args.overrides))
        if "model" not in config:
            raise ConfigError("model", "the config has no model to plan")
        with torch.device("meta"):  # shapes only: nothing of the model is allocated
            model = build_models(config["model"])
        runner, kwargs = build_train_call(config, model=model)
        spec = make_spec(runner, {**kwargs, "dry_run": True})
        plan = memory_plan(runner, spec, world_size=args.nprocs or spec.nprocs or 1, node_size=args.node_size,
                           device=args.device)
    except ConfigError as exc:
        sys.stderr.write(f"torchstage plan: error: {exc}\n")
        return 2
    except (TypeError, ValueError) as exc:
        sys.stderr.write(f"torchstage plan: error: {str(exc).splitlines()[0]}\n")
        return 2
    sys.stdout.write(f"{plan}\n")
    return 0
