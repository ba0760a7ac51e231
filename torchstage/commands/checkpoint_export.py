"""``torchstage checkpoint export CHECKPOINT OUT --format safetensors``: a model's trained weights as a folder that
Hugging Face's ``from_pretrained`` loads (the source folder's ``config.json`` copied beside them)."""
import glob
import os
import shutil
import sys

from torchstage.files.checkpoint_read import load_checkpoint
from torchstage.files.checkpoint_format import CheckpointError, clean_state_dict
from torchstage.files.pretrained import SAFETENSORS_INDEX
from torchstage.files.safetensors_io import is_tensor_state, parse_size, save_safetensors

#: What ``--config`` copies from a Hugging Face folder, where present (config.json is required).
CONFIG_FILES = ("config.json", "generation_config.json")


def add_parser(sub) -> None:
    """Register ``checkpoint export`` under ``torchstage checkpoint``."""
    export = sub.add_parser("export", help="write a model's weights as safetensors (Hugging Face from_pretrained)",
                            description="Read a torchstage checkpoint (a file, or a sharded directory written on any "
                                        "mesh: read whole) and write one model's weights into OUT as safetensors, in "
                                        "shards with an index when they exceed --max-shard-size, as save_pretrained "
                                        "does. With --config, the config.json (and generation_config.json) of the "
                                        "folder the model came from is copied too, so transformers' "
                                        "AutoModel*.from_pretrained(OUT) loads it.")
    export.add_argument("path", metavar="CHECKPOINT", help="a checkpoint (e.g. logs/checkpoints/last.pth)")
    export.add_argument("out", metavar="OUT", help="the folder to write (new or empty)")
    export.add_argument("--format", choices=["safetensors"], default="safetensors", help="the weights format")
    export.add_argument("--config", metavar="PATH", help="a Hugging Face folder (or its config.json) to copy the "
                                                         "model's config from")
    export.add_argument("--model", default=None, help="which model of the checkpoint (default: its only one)")
    export.add_argument("--max-shard-size", default="5GB", help="the largest shard file (default 5GB)")
    export.set_defaults(func=run_export)


def run_export(args) -> int:
    """Export, or one line on stderr and exit status 2 for what cannot be exported."""
    try:
        size = parse_size(args.max_shard_size)
        configs = _config_files(args.config)
        _check_out(args.out)
        checkpoint = load_checkpoint(args.path)
        state = _model_state(checkpoint, args.model, args.path)
    except (CheckpointError, ValueError) as e:
        sys.stderr.write(f"torchstage checkpoint export: {e}\n")
        return 2
    files = save_safetensors(state, args.out, size, metadata={"torchstage_checkpoint": os.path.abspath(args.path)})
    for config in configs:
        shutil.copyfile(config, os.path.join(args.out, os.path.basename(config)))
    values = sum(t.numel() for t in state.values())
    sys.stdout.write(f"wrote {args.out}: {len(state)} tensors, {values:,} values in {', '.join(files)}"
                     f"{', ' + ', '.join(os.path.basename(c) for c in configs) if configs else ''}\n")
    return 0


def _config_files(config) -> list:
    """The config files ``--config`` names (a folder or its config.json)."""
    if config is None:
        return []
    path = os.path.join(config, "config.json") if os.path.isdir(config) else config
    if not os.path.isfile(path):
        raise ValueError(f"--config {config!r} has no config.json: give the Hugging Face folder the model was built "
                         f"from (or its config.json)")
    folder = os.path.dirname(path)
    return [path] + [os.path.join(folder, name) for name in CONFIG_FILES[1:]
                     if os.path.isfile(os.path.join(folder, name))]


def _check_out(out: str) -> None:
    """OUT must be a new or empty folder, or one without weights."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"OUT {out!r} is a file; give a folder (new or empty)")
    if glob.glob(os.path.join(out, "*.safetensors")) or os.path.exists(os.path.join(out, SAFETENSORS_INDEX)):
        raise ValueError(f"OUT {out!r} already holds safetensors weights; give a new or empty folder (shards of two "
                         f"exports must not mix)")


def _model_state(checkpoint: dict, name, path: str) -> dict:
    """The state of the checkpoint's model ``name`` (its only one by default)."""
    models = checkpoint.get("models", {})
    if name is None:
        if len(models) != 1:
            raise ValueError(f"{path!r} holds models {sorted(models)}; pick one with --model")
        name = next(iter(models))
    if name not in models:
        raise ValueError(f"{path!r} has no model {name!r}; it has {sorted(models)}")
    state = clean_state_dict(models[name])
    if not is_tensor_state(state):
        raise ValueError(f"model {name!r} of {path!r} holds values that are not tensors; safetensors stores tensors")
    return state
