"""What ``--allow-targets`` admits: a component of a kind ``train()`` takes below an allowed prefix, or a callable the
allow-list names in full; found without importing a module the config names, and never what writes files or starts
processes (:mod:`torchstage.config.refused_targets`). Admitting what it names, not what it fails to refuse."""
import difflib
import importlib
import importlib.util
import inspect
import sys

from torchstage.config.refused_targets import refusal, refused_module

#: The kinds of component a config may build under an allow-list: ``(module, class)``, looked up in the modules
#: already imported (a class of a kind that is not imported cannot be a subclass of it), so naming them imports
#: nothing. Criteria and metrics of torchmetrics are ``nn.Module``s.
KINDS = (
    ("torch.nn.modules.module", "Module", "an nn.Module (model or criterion)"),
    ("torch.optim.optimizer", "Optimizer", "an optimizer"),
    ("torch.optim.lr_scheduler", "LRScheduler", "an LR scheduler"),
    ("torch.optim.lr_scheduler", "ReduceLROnPlateau", "an LR scheduler"),
    ("torch.utils.data.dataset", "Dataset", "a dataset"),
    ("torch.utils.data.sampler", "Sampler", "a sampler"),
    ("torch.utils.data.dataloader", "DataLoader", "a DataLoader"),
    ("torchstage.callbacks.base", "Callback", "a callback (loggers too)"),
    ("torchstage.metrics.base", "Metric", "a metric"),
    ("torchstage.runner.runner", "Runner", "a runner"),
    ("torchstage.strategies.base", "Strategy", "a strategy"),
    ("torchstage", "Engine", "an engine"),
    ("torchstage.periods", "Period", "a period (Batch, Epoch)"),
    ("torchstage.callbacks.training.loss_spike", "LossSpike", "a callback's setting"),
    ("torchstage.callbacks.training.output_losses", "Loss", "a callback's setting"),
    ("torchstage.callbacks.training.output_losses", "Regularizer", "a callback's setting"),
    ("optuna.samplers", "BaseSampler", "an Optuna sampler (torchstage tune)"),
    ("optuna.pruners", "BasePruner", "an Optuna pruner (torchstage tune)"),
)
KIND_NAMES = "an nn.Module, optimizer, LR scheduler, dataset, sampler, DataLoader, callback, metric, runner or strategy"


class Refused(Exception):
    """Why a target is not admitted; the caller adds the YAML path."""


def admit(target: str, allowed: tuple, kwargs=None):
    """The object ``target`` names if the allow-list ``allowed`` admits it (for a call with ``kwargs``, None: not
    known yet); raises :class:`Refused` before importing anything outside what the allow-list names."""
    parts = target.split(".")
    dunder = next((p for p in parts if p.startswith("__") and p.endswith("__")), None)
    if dunder is not None:
        raise Refused(f"{target!r} walks through the attribute {dunder!r}; with allowed module prefixes {list(allowed)} a "
                      f"_target_ names a class or function, nothing inside it (and no __main__ module); nothing was "
                      f"imported")
    obj = _resolve(target, parts, allowed)
    if not callable(obj):
        raise Refused(f"{target!r} is a {type(obj).__name__}, not a class or function to call")
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) or not _under(module, allowed):
        origin = f"is defined in module {module!r}" if isinstance(module, str) else "has no defining module"
        raise Refused(f"{target!r} {origin}, which is not under the allowed module prefixes {list(allowed)}; nothing "
                      f"was called")
    why = refusal(obj, kwargs)
    if why is not None:
        raise Refused(f"{target!r} is refused under --allow-targets even below an allowed prefix and even listed: "
                      f"{why}; nothing was called")
    if target in allowed or _kind(obj) is not None:
        return obj
    what = "a function" if inspect.isroutine(obj) else (f"the class {obj.__name__}" if inspect.isclass(obj)
                                                        else f"a {type(obj).__name__}")
    raise Refused(f"{target!r} is refused under --allow-targets: it is {what}, not a component of a kind train() "
                  f"takes ({KIND_NAMES}); to call it, list it by its full name: --allow-targets "
                  f"{','.join(allowed)},{target}; nothing was called")


def _resolve(target: str, parts: list, allowed: tuple):
    """Walk ``target`` from its top-level package through attributes; a module not imported yet is imported only
    when the allow-list names it (or something in it); anything else is refused before its code runs."""
    named = {".".join(entry.split(".")[:i]) for entry in allowed for i in range(1, entry.count(".") + 2)}
    top = parts[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        raise LookupError(f"cannot import {target!r}: no module named {top!r}; is the package installed and on "
                          f"sys.path?")
    obj, done = _import(top, target), top
    for attr in parts[1:]:
        name = f"{done}.{attr}"
        if inspect.ismodule(obj) and name in sys.modules:
            obj = sys.modules[name]
        elif hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif inspect.ismodule(obj) and _is_submodule(obj, name):
            why = refused_module(name)
            if why is not None:
                raise Refused(f"{target!r} is refused under --allow-targets even below an allowed prefix and even "
                              f"listed: it {why}; nothing was imported")
            if name not in named:
                raise Refused(f"{name!r} is not imported by importing {top!r}, and under --allow-targets torchstage "
                              f"imports no other module a config names (importing runs its code): name it in "
                              f"--allow-targets (e.g. {'.'.join(parts[:-1]) if len(parts) > 2 else name}) or "
                              f"import it in {top}'s __init__.py; nothing was imported")
            obj = _import(name, target)
        else:
            close = difflib.get_close_matches(attr, [n for n in dir(obj) if not n.startswith("_")], n=3)
            hint = f"; did you mean {', '.join(repr(f'{done}.{c}') for c in close)}?" if close else ""
            raise LookupError(f"cannot import {target!r}: tried module {done!r}, which has no attribute {attr!r}{hint}")
        done = name
        if inspect.ismodule(obj) and not (_under(obj.__name__, allowed) or obj.__name__ in named):
            raise Refused(f"{target!r}: {done!r} is the module {obj.__name__!r}, which is not under the allowed "
                          f"module prefixes {list(allowed)}; nothing was called")
    return obj


def _import(name: str, target: str):
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise LookupError(f"importing module {name!r} for {target!r} failed: {type(exc).__name__}: {exc}") from exc


def _is_submodule(package, name: str) -> bool:
    """Whether ``name`` is a module of the already imported ``package`` (found on its path, nothing imported)."""
    if not hasattr(package, "__path__"):
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _kind(obj):
    """The description of the kind ``obj`` (a class) is a subclass of, or None."""
    if not inspect.isclass(obj):
        return None
    for module, name, description in KINDS:
        base = getattr(sys.modules.get(module), name, None) if module != "torchstage" else \
            sys.modules.get("torchstage").__dict__.get(name) if "torchstage" in sys.modules else None
        if inspect.isclass(base) and issubclass(obj, base):
            return description
    return None


def _under(name: str, allowed) -> bool:
    return any(name == p.rstrip(".") or name.startswith(p.rstrip(".") + ".") for p in allowed)
