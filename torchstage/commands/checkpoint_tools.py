"""``torchstage checkpoint inspect PATH``, ``consolidate DIR OUT.pth`` and ``export``: read checkpoints safely,
without a model.

Both read single-file and sharded (FSDP, directory) checkpoints; ``consolidate`` turns a sharded one
into one file that ``torch.load(..., weights_only=True)`` reads; ``export``
(:mod:`~torchstage.commands.checkpoint_export`) writes a model's weights as safetensors.
"""
import json
import os
import sys

import torch

from torchstage.commands import checkpoint_export
from torchstage.distributed.layout import MeshLayout
from torchstage.files.atomic import write_atomic
from torchstage.files.checkpoint_read import load_checkpoint
from torchstage.files.checkpoint_file import serialize
from torchstage.files.checkpoint_format import CheckpointError

def add_parser(subparsers) -> None:
    """Register ``checkpoint inspect`` on the ``torchstage`` command."""
    parser = subparsers.add_parser("checkpoint", help="inspect checkpoint files",
                                   description="Work with torchstage checkpoint files.")
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    inspect = sub.add_parser("inspect", help="print a checkpoint's format, loop position, metrics and versions",
                             description="Print what a checkpoint holds. It is loaded with weights_only=True, "
                                         "so no code from the file runs, and no model is built.")
    inspect.add_argument("path", help="a .pth file written by torchstage")
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    inspect.set_defaults(func=run_inspect)
    consolidate = sub.add_parser("consolidate", help="write a sharded (FSDP) checkpoint as one .pth file",
                                 description="Read a sharded checkpoint directory (any world size wrote it) into "
                                             "full tensors and write it as one torchstage checkpoint file, "
                                             "atomically. A plain model loads its weights with "
                                             "torch.load(OUT, weights_only=True)['models']['model'].")
    consolidate.add_argument("path", metavar="DIR", help="a sharded checkpoint (e.g. logs/checkpoints/last.pth)")
    consolidate.add_argument("out", metavar="OUT.pth", help="the file to write")
    consolidate.set_defaults(func=run_consolidate)
    checkpoint_export.add_parser(sub)


def summarize(checkpoint: dict) -> dict:
    """The plain-value summary of a loaded checkpoint: everything but the tensors, which are counted."""
    models = {name: _tensor_summary(state) for name, state in checkpoint.get("models", {}).items()}
    return {
        "format": checkpoint.get("format"),
        "loop": checkpoint.get("loop", {}),
        "metrics": checkpoint.get("metrics", {}),
        "meta": checkpoint.get("meta", {}),
        "models": models,
        "optimizers": sorted(checkpoint.get("optimizers", {})),
        "schedulers": sorted(checkpoint.get("schedulers", {})),
        "scaler": bool(checkpoint.get("scaler")),
        "callbacks": sorted(checkpoint.get("callbacks", {})),
        "ranks": len(checkpoint.get("rng", [])),
        "sharded": bool(checkpoint.get("meta", {}).get("sharded")),
    }


def _tensor_summary(state: dict) -> dict:
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    return {"tensors": len(tensors), "parameters": sum(t.numel() for t in tensors),
            "bytes": sum(t.numel() * t.element_size() for t in tensors)}


def format_summary(path: str, info: dict) -> str:
    """The human-readable report of :func:`summarize`."""
    loop, meta = info["loop"], info["meta"]
    where = "end of epoch" if loop.get("epoch_done") else \
        f"mid-epoch, after batch {loop.get('loader_batch')} of loader {loop.get('loader')!r}"
    lines = [f"checkpoint  {path}", f"format      {info['format']}",
             f"position    stage {loop.get('stage')!r}, epoch {loop.get('epoch')} ({where})",
             f"counters    global epoch {loop.get('global_epoch_step')}, global batch {loop.get('global_batch_step')}, "
             f"global sample {loop.get('global_sample_step')}",
             f"written     {meta.get('time')} by torchstage {meta.get('torchstage')}, torch {meta.get('torch')}, "
             f"world size {meta.get('world_size')}" + (" (sharded: one directory, read whole)" if info["sharded"]
                                                       else "")]
    if meta.get("mesh"):  # a strategy with a device mesh (HSDP, tensor parallel, pipeline), outermost first
        mesh = meta["mesh"]
        names = [name for name in MeshLayout.names() if name in mesh] + [name for name in mesh if name not in
                                                                            MeshLayout.names()]
        lines.append(f"strategy    {meta.get('strategy')}, mesh " + " x ".join(f"{name} {mesh[name]}" for name in names))
    for name, summary in info["models"].items():
        lines.append(f"model       {name}: {summary['tensors']} tensors, {summary['parameters']:,} values, "
                     f"{summary['bytes'] / 2**20:.2f} MiB")
    lines.append(f"optimizers  {', '.join(info['optimizers']) or '-'}; schedulers {', '.join(info['schedulers']) or '-'}"
                 f"; scaler {'yes' if info['scaler'] else 'no'}")
    lines.append(f"callbacks   {', '.join(info['callbacks']) or '-'}")
    for loader, metrics in info["metrics"].items():
        values = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        lines.append(f"metrics     {loader}: {values or '-'}")
    if meta.get("hparams"):
        lines.append("hparams     " + " ".join(f"{k}={v}" for k, v in meta["hparams"].items()))
    return "\n".join(lines)


def run_inspect(args) -> int:
    try:
        checkpoint = load_checkpoint(args.path)
    except CheckpointError as e:
        sys.stderr.write(f"torchstage checkpoint inspect: {e}\n")
        return 2
    info = summarize(checkpoint)
    text = json.dumps(info, indent=2, default=str) if args.json else format_summary(args.path, info)
    sys.stdout.write(text + "\n")
    return 0


def run_consolidate(args) -> int:
    if not os.path.isdir(args.path):
        sys.stderr.write(f"torchstage checkpoint consolidate: {args.path!r} is not a sharded checkpoint directory "
                         f"(a single-file checkpoint needs no consolidation)\n")
        return 2
    try:
        checkpoint = load_checkpoint(args.path)
        checkpoint["meta"] = {**checkpoint.get("meta", {}), "sharded": False, "consolidated_from": args.path}
        write_atomic(args.out, serialize(checkpoint))
    except CheckpointError as e:
        sys.stderr.write(f"torchstage checkpoint consolidate: {e}\n")
        return 2
    models = ", ".join(f"{name} ({sum(t.numel() for t in state.values() if hasattr(t, 'numel')):,} values)"
                       for name, state in checkpoint["models"].items())
    sys.stdout.write(f"wrote {args.out}: models {models}, from a checkpoint of "
                     f"{checkpoint['meta'].get('world_size')} process(es)\n")
    return 0
