"""Tensor-parallel plans, checked before they are applied: every entry must name a module of the model, and the plan
must split something.

A plan maps module names (``fnmatch`` patterns per dotted segment, as torch's ``parallelize_module`` reads them:
``"blocks.*.attention.wq"``) to torch ``ParallelStyle`` objects, or to the style names of a transformers model's own
plan (``base_model_tp_plan``: ``"colwise"``, ``"rowwise"``...), translated here to torch's styles. A plan applied by
a user function (``ModelParallel(parallelize=fn)``) is checked by what torch reports while ``fn`` runs (an entry it
could not resolve) and by its result (some parameter split over the tensor mesh).
"""
import difflib
import re
import warnings
from fnmatch import fnmatch

import torch

#: What torch warns for a plan entry that names no module (``parallelize_module`` then skips it).
_UNRESOLVED = re.compile(r"Parallelize plan key '([^']*)' could not be resolved: no submodule matching token '([^']*)'")


def transformers_styles() -> dict:
    """transformers' plan style names -> a function making the torch ParallelStyle each stands for (its layouts, as
    ``transformers.distributed.tensor_parallel`` defines them); other names are refused by :func:`resolve_plan`."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    return {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
        "sequence_parallel": lambda: SequenceParallel(use_local_output=True),
    }


def model_plan(model: torch.nn.Module):
    """The tensor-parallel plan a transformers model carries (``model.tp_plan``: its class's and its base model's
    ``base_model_tp_plan``, by full module name), or None."""
    plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None)
    if not plan:
        config_plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
        prefix = getattr(model, "base_model_prefix", "")
        inner = prefix and getattr(model, prefix, None) is not None
        plan = {f"{prefix}.{k}" if inner else k: v for k, v in (config_plan or {}).items()} or None
    return dict(plan) if plan else None


def resolve_plan(plan, owner: str) -> dict:
    """``plan`` (module pattern -> a ParallelStyle or a transformers style name) with every name made a torch style;
    TypeError/ValueError naming the entry for anything else."""
    from torch.distributed.tensor.parallel import ParallelStyle
    if not isinstance(plan, dict) or not plan:
        raise TypeError(f"{owner}: plan must be a non-empty dict of module name -> ParallelStyle (or a transformers "
                        f"style name such as 'colwise'), got {plan!r}")
    styles, resolved = transformers_styles(), {}
    for key, style in plan.items():
        if not isinstance(key, str):
            raise TypeError(f"{owner}: plan keys are module names (str), got {key!r}")
        if isinstance(style, str):
            if style not in styles:
                raise ValueError(f"{owner}: plan[{key!r}] = {style!r} is not a style torchstage can translate to "
                                 f"torch's (it knows {', '.join(sorted(styles))}); give a ParallelStyle for it, or "
                                 f"apply the plan yourself with parallelize=fn")
            style = styles[style]()
        elif not isinstance(style, ParallelStyle):
            raise TypeError(f"{owner}: plan[{key!r}] must be a torch ParallelStyle (ColwiseParallel(), "
                            f"RowwiseParallel()...) or a style name, got {type(style).__name__}")
        resolved[key] = style
    return resolved


def matching(model: torch.nn.Module, key: str) -> list:
    """The names of the modules of ``model`` that plan entry ``key`` names (each dotted segment an fnmatch pattern)."""
    if key == "":
        return [""]
    tokens = key.split(".")
    return [name for name, _ in model.named_modules() if name and len(name.split(".")) == len(tokens)
            and all(fnmatch(part, token) for part, token in zip(name.split("."), tokens))]


def check_entries(model: torch.nn.Module, keys, owner: str) -> None:
    """ValueError, before training, naming each plan entry that names no module of ``model`` and the names it may
    have meant."""
    missing = [key for key in keys if not matching(model, key)]
    if missing:
        raise ValueError(f"{owner}: the tensor-parallel plan has entries that name no module of the model: "
                         + "; ".join(_unmatched(model, key) for key in missing)
                         + ". Each entry must name modules as model.named_modules() does ('*' stands for one part)")


def _unmatched(model, key: str, token: str = None) -> str:
    """What is wrong with plan entry ``key`` (``token``: the part torch found no module for), and the names meant."""
    names = [name for name, _ in model.named_modules() if name]
    patterns = sorted({re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name) for name in names})
    candidates = patterns + sorted({name.split(".", i)[-1] for name in names for i in range(name.count(".") + 1)})
    close = difflib.get_close_matches(key, list(dict.fromkeys(candidates)), n=3, cutoff=0.5)
    where = f" (no module part matches {token!r})" if token and token != key else ""
    if close:
        return f"{key!r} names no module{where}; did you mean {' or '.join(map(repr, close))}?"
    leaves = [p for p in patterns if not any(q.startswith(p + ".") for q in patterns)]
    return (f"{key!r} names no module{where}; the model's layers are named like "
            f"{', '.join(leaves[:8])}{' ...' if len(leaves) > 8 else ''}")


def apply_plan(model: torch.nn.Module, tensor_mesh, plan, owner: str) -> torch.nn.Module:
    """``model`` split by ``plan`` (styles resolved, entries checked first) with torch's ``parallelize_module``."""
    from torch.distributed.tensor.parallel import parallelize_module  # heavy; tensor-parallel runs only
    resolved = resolve_plan(plan, owner)
    check_entries(model, resolved, owner)
    parallelize_module(model, tensor_mesh, resolved)
    check_changed(model, owner)
    return model


def run_parallelize(fn, model: torch.nn.Module, tensor_mesh, owner: str) -> torch.nn.Module:
    """``fn(model, tensor_mesh)``, refused (ValueError naming the entries and the module names meant) when torch
    reports a plan entry it could not resolve, or when it split no parameter."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(model, tensor_mesh)
    unresolved = []
    for record in caught:
        found = _UNRESOLVED.search(str(record.message))
        if found:
            unresolved.append(found.groups())
        else:
            warnings.warn_explicit(record.message, record.category, record.filename, record.lineno)
    if unresolved:
        entries = list(dict.fromkeys(unresolved))
        raise ValueError(f"{owner}: the plan that parallelize(model, tensor_mesh) applied has entries that name no "
                         f"module: " + "; ".join(_unmatched(model, key, token) for key, token in entries)
                         + ". torch skips such an entry, and the layers it leaves whole then meet split ones; name "
                           "the modules as model.named_modules() does (relative to the module the plan is applied to)")
    if not isinstance(result, torch.nn.Module):
        raise TypeError(f"{owner}: parallelize(model, tensor_mesh) must return the model (an nn.Module), got "
                        f"{type(result).__name__}")
    check_changed(result, owner)
    return result


def check_changed(model: torch.nn.Module, owner: str) -> None:
    """ValueError when no parameter of ``model`` is split over a device mesh: the plan changed nothing, and the run
    would train without tensor parallelism while announcing it."""
    from torch.distributed.tensor import DTensor
    if not any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError(f"{owner}: the tensor-parallel plan split no parameter of the model (no module it names "
                         f"holds parameters), so the run would train without tensor parallelism; name the linear "
                         f"(or embedding) layers to split, as model.named_modules() lists them")
