"""Catalyst 22's model post-processing helpers (``utils.trace_model``, ``quantize_model``, ``prune_model``,
``onnx_export``) with its signatures, each a thin call of the torch API that is torchstage's spelling (noted once).

They act on the plain module under a DDP or ``torch.compile`` wrapper, as Catalyst's did.
"""
import torch
from torch.nn.utils import prune

from torchstage.logging_setup import note_alias
from torchstage.strategies.single import SingleDevice

_QUANTIZED = {"qint8": torch.qint8, "quint8": torch.quint8}
_UNSTRUCTURED = {"l1_unstructured": prune.l1_unstructured, "random_unstructured": prune.random_unstructured}
_STRUCTURED = {"ln_structured": prune.ln_structured, "random_structured": prune.random_structured}
ONNX_MISSING = ("utils.onnx_export needs the onnx package, which torch.onnx.export uses to write the file: "
                "pip install 'torchstage[onnx]' (or pip install onnx)")


class _Method(torch.nn.Module):
    """Calls ``model.<method_name>`` as its forward, so that a method other than forward can be traced."""

    def __init__(self, model: torch.nn.Module, method_name: str):
        super().__init__()
        if not callable(getattr(model, method_name, None)):
            raise ValueError(f"method_name={method_name!r}: {type(model).__name__} has no such method")
        self.model, self.method_name = model, method_name

    def forward(self, *args, **kwargs):
        return getattr(self.model, self.method_name)(*args, **kwargs)


def _plain(model) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return SingleDevice().unwrap(model)


def trace_model(model, batch, method_name: str = "forward") -> torch.jit.ScriptModule:
    """``torch.jit.trace`` of ``model.<method_name>`` on ``batch`` (a tensor or a tuple of tensors)."""
    note_alias("utils.trace_model(model, batch)", "torch.jit.trace(model, batch) or runner.trace(batch=...)",
               version="22")
    return torch.jit.trace(_Method(_plain(model), method_name), example_inputs=batch)


def quantize_model(model, qconfig_spec: dict = None, dtype="qint8") -> torch.nn.Module:
    """Dynamic quantization of the model's weights (a quantized copy on the CPU; Linear/LSTM layers by default)."""
    note_alias("utils.quantize_model(model)", "torch.ao.quantization.quantize_dynamic(model, dtype=torch.qint8)",
               version="22")
    dtype = _QUANTIZED.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in _QUANTIZED.values():
        raise ValueError(f"quantize_model(dtype={dtype!r}): expected 'qint8' or 'quint8'")
    from torch.ao import quantization  # deprecated in recent torch, still the API Catalyst's helper called
    return quantization.quantize_dynamic(_plain(model).cpu(), qconfig_spec=qconfig_spec, dtype=dtype)


def prune_model(model, pruning_fn, amount, keys_to_prune=None, layers_to_prune=None, dim: int = None,
                l_norm: int = None) -> None:
    """Prunes ``keys_to_prune`` (default ``["weight"]``) of every module that has them (or of ``layers_to_prune``,
    module names) in place with ``torch.nn.utils.prune``; ``pruning_fn`` is a function of that module or its name
    (``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"`` with ``dim`` and ``l_norm``,
    ``"random_structured"`` with ``dim``)."""
    note_alias("utils.prune_model(model, pruning_fn, amount)",
               "torch.nn.utils.prune.l1_unstructured(module, 'weight', amount) per module", version="22")
    fn = _pruning_fn(pruning_fn, dim, l_norm)
    keys = list(keys_to_prune or ["weight"])
    layers = None if layers_to_prune is None else set(layers_to_prune)
    modules = dict(_plain(model).named_modules())
    if layers is not None and not layers <= set(modules):
        raise ValueError(f"prune_model: layers_to_prune {sorted(layers - set(modules))} are not modules of the model; "
                         f"it has {sorted(n for n in modules if n)}")
    pruned = 0
    for name, module in modules.items():
        if layers is not None and name not in layers:
            continue
        if not all(isinstance(getattr(module, key, None), torch.Tensor) for key in keys):
            if layers is not None:
                raise ValueError(f"prune_model: layer {name!r} ({type(module).__name__}) has no tensor {keys}")
            continue
        for key in keys:
            fn(module, name=key, amount=amount)
        pruned += 1
    if not pruned:
        raise ValueError(f"prune_model: no module of the model has {keys}")


def _pruning_fn(pruning_fn, dim, l_norm):
    if callable(pruning_fn):
        return pruning_fn
    if pruning_fn in _UNSTRUCTURED:
        return _UNSTRUCTURED[pruning_fn]
    if pruning_fn not in _STRUCTURED:
        raise ValueError(f"prune_model(pruning_fn={pruning_fn!r}): expected a function or one of "
                         f"{[*_UNSTRUCTURED, *_STRUCTURED]}")
    if dim is None or (pruning_fn == "ln_structured" and l_norm is None):
        raise ValueError(f"prune_model(pruning_fn={pruning_fn!r}) needs dim=..."
                         + (" and l_norm=..." if pruning_fn == "ln_structured" else ""))
    extra = {"dim": dim, **({"n": l_norm} if pruning_fn == "ln_structured" else {})}
    return lambda module, name, amount: _STRUCTURED[pruning_fn](module, name, amount, **extra)


def onnx_export(model, batch, file: str, method_name: str = "forward", input_names=None, output_names=None,
                dynamic_axes=None, opset_version: int = 9, do_constant_folding: bool = False,
                return_model: bool = False, verbose: bool = False):
    """Writes ``model.<method_name>`` traced on ``batch`` to the ONNX ``file`` with torch's TorchScript-based
    exporter (which still writes Catalyst's default opset 9); returns the loaded ``onnx`` model if
    ``return_model``. Needs the ``onnx`` package (the ``onnx`` extra)."""
    note_alias("utils.onnx_export(model, batch, file)", "torch.onnx.export(model, (batch,), file, dynamo=False)",
               version="22")
    try:
        import onnx
    except ImportError:
        raise ImportError(ONNX_MISSING) from None
    net = _plain(model)
    net = net if method_name == "forward" else _Method(net, method_name)
    args = batch if isinstance(batch, tuple) else (batch,)
    torch.onnx.export(net, args, file, verbose=verbose, input_names=input_names, output_names=output_names,
                      dynamic_axes=dynamic_axes, opset_version=opset_version, do_constant_folding=do_constant_folding,
                      dynamo=False)
    return onnx.load(file) if return_model else None
