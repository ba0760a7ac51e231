"""Catalyst 20.12 names that torchstage accepts (modules, enum members, a callback's scope), each with a one-time
note naming torchstage's spelling.

Names that mean something else in torchstage are refused here with the reason, never guessed.
See docs/migrating-from-catalyst.md for the whole table.
"""
from torchstage.logging_setup import note_alias


#: ``torchstage.<old>`` -> the torchstage name it resolves to (``import torchstage as dl``/``as utils``).
MODULE_ALIASES = {
    "CallbackNode": "CallbackScope",
    "set_global_seed": "set_seed",
    "TensorboardLogger": "TensorBoardLogger",
    "VerboseLogger": "ProgressBar",
    "BatchMetricCallback": "MetricCallback",
}

#: Catalyst 22 names with no torchstage object of their own -> the compat module defining them (imported on first
#: use; each notes torchstage's spelling once when built or called).
CATALYST22_NAMES = {
    **dict.fromkeys(("PrecisionRecallF1SupportCallback", "MultilabelAccuracyCallback",
                     "MultilabelPrecisionRecallF1SupportCallback"), "torchstage.catalyst.callbacks22"),
    **dict.fromkeys(("trace_model", "quantize_model", "prune_model", "onnx_export"),
                    "torchstage.catalyst.model_utils"),
}

#: Catalyst 20.12 enum members (lower-case or renamed) -> torchstage member name.
_MEMBERS = {
    "CallbackOrder": {"internal": "Internal", "metric": "Metric", "metric_aggregation": "MetricAggregation",
                      "backward": "Backward", "optimizer": "Optimizer", "scheduler": "Scheduler",
                      "checkpoint": "Checkpoint", "logging": "Logging", "external": "External"},
    "CallbackScope": {"all": "All", "main": "Main", "master": "Main", "Master": "Main"},
}
_REFUSED = {
    ("CallbackScope", "stage"): "Catalyst 20.12's CallbackScope.stage/experiment set a callback's lifetime across "
                                "stages; torchstage has no such setting: callbacks given to train() live for the "
                                "whole run, those in stages={...} for their stage. Drop the scope=... argument "
                                "(torchstage's CallbackScope says which ranks run a callback: All or Main)",
    ("CallbackScope", "worker"): "Catalyst 20.12's CallbackNode.worker (every rank but the main one) has no "
                                 "torchstage equivalent; use CallbackScope.All and test runner.engine.is_main",
    ("CallbackOrder", "validation"): "Catalyst 20.12's CallbackOrder.Validation (after the optimizer, before the "
                                     "scheduler) is not a torchstage phase; use CallbackOrder.Optimizer + 10",
}
_REFUSED[("CallbackScope", "experiment")] = _REFUSED[("CallbackScope", "stage")]


def enum_alias(enum, name: str):
    """The member of ``enum`` that Catalyst 20.12's ``name`` means; AttributeError saying why otherwise."""
    refused = _REFUSED.get((enum.__name__, name.lower()))
    if refused is not None:
        raise AttributeError(f"{enum.__name__}.{name}: {refused}")
    member = _MEMBERS.get(enum.__name__, {}).get(name)
    if member is None:
        raise AttributeError(f"type object {enum.__name__!r} has no attribute {name!r}; members: "
                             f"{', '.join(m.name for m in enum)}")
    note_alias(f"{enum.__name__}.{name}", f"{enum.__name__}.{member}")
    return enum[member]


def callback_scope(owner: str, node, catalyst_scope: tuple, scope, scope_type):
    """The ``scope_type`` member (``CallbackScope``) that ``Callback.__init__``'s ``scope``, or Catalyst 20.12's
    ``node``, asks for (None if neither); refuses Catalyst's third positional (stage/experiment) scope."""
    if catalyst_scope:
        why = _REFUSED[("CallbackScope", "stage")]
        raise TypeError(f"{owner}(): a third positional argument is Catalyst 20.12's scope "
                        f"(CallbackScope.stage/experiment, got {catalyst_scope[0]!r}). {why}")
    if node is not None:
        if scope is not None:
            raise TypeError(f"{owner}(): give scope=... or Catalyst 20.12's node=..., not both")
        note_alias("Callback(node=...)", "Callback(scope=CallbackScope.All / CallbackScope.Main)")
        if isinstance(node, bool) or not isinstance(node, int) or int(node) not in (0, 1):
            hint = _REFUSED[("CallbackScope", "worker")] if node == 2 else "expected CallbackNode.all or .master"
            raise ValueError(f"{owner}(): node={node!r}: {hint}")
        return scope_type(int(node))
    if scope is not None and not isinstance(scope, scope_type):
        raise TypeError(f"{owner}(): scope must be CallbackScope.All, .Main or .Distributed (which ranks run "
                        f"the callback), got {scope!r}. {_REFUSED[('CallbackScope', 'stage')]}")
    return scope
