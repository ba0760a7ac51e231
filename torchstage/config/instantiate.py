"""Components from config nodes: ``{_target_: import.path, **kwargs}`` -> object, errors named by YAML path."""
import difflib
import importlib
import inspect
import os
import types
import typing
from collections.abc import Mapping

from torchstage.config.admission import Refused, admit

TARGET = "_target_"
#: Comma-separated module prefixes a ``_target_`` must start with (``torchstage run --allow-targets``); unset: any.
ALLOWED_TARGETS_VAR = "TORCHSTAGE_ALLOWED_TARGETS"


def allowed_prefixes() -> tuple:
    """The ``_target_`` prefixes allowed by ``$TORCHSTAGE_ALLOWED_TARGETS`` (empty: any import path)."""
    return tuple(p.strip() for p in os.environ.get(ALLOWED_TARGETS_VAR, "").split(",") if p.strip())


class ConfigError(ValueError):
    """A config mistake, raised before training; the message starts with the YAML path of the offending key."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


def join(path: str, key) -> str:
    """``model`` + ``in_features`` -> ``model.in_features``: the dotted form ``--set`` accepts too."""
    return f"{path}.{key}" if path else str(key)


def is_component(node) -> bool:
    """A mapping with a ``_target_`` key: something to import and call."""
    return isinstance(node, Mapping) and TARGET in node


def import_target(target, path: str, kwargs: Mapping = None):
    """The object named by a dotted import path such as ``torch.optim.lr_scheduler.MultiStepLR``; under an
    allow-list, only what it admits (:mod:`torchstage.config.admission`), for a call with ``kwargs`` (None: unknown)."""
    where = join(path, TARGET)
    if not isinstance(target, str) or not target or target.startswith(".") or ".." in target:
        raise ConfigError(where, f"expected an import path such as 'torch.nn.Linear', got {target!r}")
    allowed = allowed_prefixes()
    if allowed and not _under(target, allowed):
        raise ConfigError(where, f"{target!r} is not under the allowed module prefixes {list(allowed)} "
                                 f"(--allow-targets / ${ALLOWED_TARGETS_VAR}); nothing was imported")
    private = [part for part in target.split(".") if part.startswith("_") and not part.endswith("__")]
    if allowed and private:
        raise ConfigError(where, f"{target!r} names the private {private[0]!r}; with allowed module prefixes "
                                 f"{list(allowed)} a _target_ names public classes and functions only")
    if allowed:
        try:
            return admit(target, allowed, kwargs)
        except (Refused, LookupError) as exc:
            raise ConfigError(where, str(exc)) from None
    parts = target.split(".")
    module, tried = None, []
    for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError as exc:
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise ConfigError(where, f"importing module {name!r} for {target!r} failed: {exc}") from exc
            tried.append(name)
        except Exception as exc:  # the module exists but raised while importing
            raise ConfigError(where, f"importing module {name!r} for {target!r} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
    if module is None:
        raise ConfigError(where, f"cannot import {target!r}: no module named {parts[0]!r} (tried "
                                 f"{', '.join(map(repr, tried))}); is the package installed and on sys.path?")
    obj, done = module, name
    for attr in parts[cut:]:
        if not hasattr(obj, attr):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(attr, names, n=3)
            hint = f"; did you mean {', '.join(repr(f'{done}.{c}') for c in close)}?" if close else ""
            raise ConfigError(where, f"cannot import {target!r}: tried module {name!r}, which has no attribute "
                                     f"{attr!r}{hint}")
        obj, done = getattr(obj, attr), f"{done}.{attr}"
    if not callable(obj):
        raise ConfigError(where, f"{target!r} is a {type(obj).__name__}, not a class or function to call")
    return obj


def _under(name: str, allowed) -> bool:
    return any(name == p.rstrip(".") or name.startswith(p.rstrip(".") + ".") for p in allowed)


def check_arguments(fn, kwargs: Mapping, path: str, target: str, given=()) -> None:
    """Fail on argument names ``fn`` does not accept (listing the accepted ones) and on plain scalar type errors."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return  # builtins without a signature: the call itself reports
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in kwargs:
        if key in given and key not in accepted:
            raise ConfigError(path, f"{target} has no argument {key!r}, which torchstage passes to this kind of "
                                    f"component (is it the right class here?); it accepts: {', '.join(accepted)}")
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(join(path, key), f"{target} has no argument {key!r}{hint}; it accepts: "
                                               f"{', '.join(a for a in accepted if a not in given) or 'nothing'}")
    hints = _type_hints(fn)
    for key, value in kwargs.items():
        kinds = _scalar_kinds(hints.get(key))
        if kinds is None or is_component(value) or isinstance(value, (Mapping, list)):
            continue
        if value is None and params[key].default is None:
            continue
        if not _matches(value, kinds):
            expected = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(join(path, key), f"{target} expects {expected} for {key!r}, got "
                                               f"{type(value).__name__} {value!r}")


def coerce_numbers(fn, kwargs: Mapping, path: str, target: str) -> dict:
    """A quoted number (YAML ``lr: "1e-3"``) where ``fn`` expects a number becomes that number; any other
    string there is refused with its YAML path, instead of failing inside ``fn``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict(kwargs)
    hints, result = _type_hints(fn), dict(kwargs)
    for key, value in kwargs.items():
        kind = _number_kind(hints.get(key), params[key].default) if key in params else None
        if kind is None or not isinstance(value, str):
            continue
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(join(path, key), f"{target} expects {kind.__name__} for {key!r}, got str {value!r}") from None
        result[key] = int(number) if kind is int and number.is_integer() else number
    return result


def _number_kind(hint, default):
    """``float``/``int`` when a parameter takes a number and no string (from its hint, else its default)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if str in args:
        return None
    for kind in (float, int):
        if kind in args:
            return kind
    if hint is None and type(default) in (int, float):
        return type(default)
    return None


def _type_hints(fn) -> dict:
    try:
        return typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else fn)
    except Exception:
        return {}


def _scalar_kinds(hint):
    """The builtin scalar types a hint allows (``Optional[float]`` -> (float, NoneType)), or None if not that simple."""
    if hint in (int, float, bool, str, type(None)):
        return (hint,)
    if typing.get_origin(hint) is typing.Union:
        kinds = [_scalar_kinds(arg) for arg in typing.get_args(hint)]
        if all(kinds):
            return tuple(k for group in kinds for k in group)
    return None


def _matches(value, kinds) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, tuple(kinds))


def instantiate(node, path: str, **given):
    """Build ``node`` recursively: components are called with their (built) kwargs plus ``given`` ones.

    Lists and plain mappings are walked, so components may nest (a DataLoader of a dataset). ``given``
    holds what the config loader supplies (an optimizer's ``params``, a scheduler's ``optimizer``).
    """
    if isinstance(node, list):
        return [instantiate(item, join(path, i)) for i, item in enumerate(node)]
    if not isinstance(node, Mapping):
        return node
    if not is_component(node):
        return {key: instantiate(value, join(path, key)) for key, value in node.items()}
    target = node[TARGET]
    fn = import_target(target, path, {key: value for key, value in node.items() if key != TARGET})
    kwargs = coerce_numbers(fn, {key: value for key, value in node.items() if key != TARGET}, path, target)
    check_arguments(fn, {**kwargs, **given}, path, target, given=given)
    kwargs = {key: instantiate(value, join(path, key)) for key, value in kwargs.items()}
    try:
        return fn(**kwargs, **given)
    except Exception as exc:
        raise ConfigError(path, f"{target}(...) failed: {type(exc).__name__}: {exc}") from exc
