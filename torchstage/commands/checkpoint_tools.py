"""``torchstage checkpoint inspect PATH``: what a checkpoint holds, read safely, without building a model."""
import json
import sys

import torch


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
             f"world size {meta.get('world_size')}"]
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
    from torchstage.checkpoint import CheckpointError, load_checkpoint
    try:
        checkpoint = load_checkpoint(args.path)
    except CheckpointError as e:
        sys.stderr.write(f"torchstage checkpoint inspect: {e}\n")
        return 2
    info = summarize(checkpoint)
    text = json.dumps(info, indent=2, default=str) if args.json else format_summary(args.path, info)
    sys.stdout.write(text + "\n")
    return 0
