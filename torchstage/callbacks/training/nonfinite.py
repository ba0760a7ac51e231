"""Bad train losses: NaN/inf (and, with ``spike=LossSpike(...)``, spikes): stop the run, skip such batches, or roll back.

``mode="stop"`` keeps each train loss (detached, on its device: no host sync) and reads them, stacked, every
``check_every`` train batches, at the end of each train loader and before any checkpoint write (a check registered
with the runner's save, :meth:`~torchstage.runner.runner.Runner.save_checkpoint`), so no checkpoint ever holds
weights trained on a non-finite loss; the error names the first such batch.
``mode="skip"`` must know before the backward whether to step, so it reads the loss every train batch
(one host sync per batch, as AMP's grad scaler does); a skipped batch sets ``runner.batch_skipped``, so
it is left out of the averages, the backward and the step; skipped batches are counted in the loader
metric ``nonfinite_skipped``.
``mode="rollback"`` checks after the optimizer step, and keeps besides each loss the largest magnitude of the weights
and of the gradients held for the next step (unless a grad scaler owns them: it skips the step of a batch whose
gradients overflow), one device scalar a batch, read with the losses: a batch whose loss is finite but whose gradient
is not is the one found, not the next one, whose loss the spoiled weights make NaN. At the first bad batch every
rank puts the run back to its last snapshot (in memory, taken after a clean check or as the loader started, by the
runner's rollback keeper, :mod:`torchstage.runner.rollback`) and goes on without that batch, as a run whose loader
never gave it would; at most ``max_rollbacks`` times.
"""
import logging
import math

import torch

from torchstage.arguments import check_int
from torchstage.callbacks.base import Callback, CallbackOrder, RollBack
from torchstage.callbacks.training.loss_spike import LossSpike
from torchstage.one_or_many import named

logger = logging.getLogger("torchstage")
#: The all-reduced first step of a bad loss when no rank has seen one.
NONE_SEEN = 2 ** 62
MODES = ("stop", "skip", "rollback")


class NonFiniteLossError(FloatingPointError):
    """A train loss was NaN or infinite; the message says where, which loss and (several processes) on which rank,
    also kept as ``origin_rank`` for the launcher's summary."""

    def __init__(self, message: str, origin_rank: int = None):
        super().__init__(message)
        self.origin_rank = origin_rank


class LossSpikeError(FloatingPointError):
    """A train loss spiked (:class:`~torchstage.callbacks.training.loss_spike.LossSpike`); said as for
    :class:`NonFiniteLossError`."""

    def __init__(self, message: str, origin_rank: int = None):
        super().__init__(message)
        self.origin_rank = origin_rank


class NonFiniteStateError(FloatingPointError):
    """The weights or gradients went NaN or infinite behind finite losses: a checkpoint would have held them (it was
    not written), or a rollback past the batch that did it was not possible; ``origin_rank`` as for
    :class:`NonFiniteLossError`."""

    def __init__(self, message: str, origin_rank: int = None):
        super().__init__(message)
        self.origin_rank = origin_rank


#: The key of the state's magnitude among the watched values (a rollback run's): judged finite or not, never a spike.
STATE = "weights or gradients"


class NonFiniteLossCallback(Callback):
    """Watches the train losses (``batch_metrics`` keys containing ``"loss"``, or ``keys``) for NaN/inf, and for
    spikes with ``spike=LossSpike(...)``; ``mode`` is ``"stop"``, ``"skip"`` or ``"rollback"`` (see the module)."""

    order = CallbackOrder.Metric + 5  # after the criterion, before averaging, backward and the step
    name = "nonfinite"
    train_batches_only = True

    def __init__(self, mode: str = "stop", check_every: int = 100, keys=None, spike: LossSpike = None,
                 max_rollbacks: int = 10):
        if mode not in MODES:
            raise ValueError(f"mode must be 'stop' (end the run at a non-finite loss), 'skip' (skip such batches) or "
                             f"'rollback' (go back to the last clean check and on without the batch), got {mode!r}")
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"check_every must be an integer >= 1, got {check_every!r}")
        if spike is not None and not isinstance(spike, LossSpike):
            raise TypeError(f"spike must be a LossSpike(factor=..., deviations=..., window=...) or None, got "
                            f"{type(spike).__name__}")
        self.mode, self.check_every, self.keys = mode, check_every, None if keys is None else tuple(keys)
        self.spike, self.max_rollbacks = spike, check_int("max_rollbacks", max_rollbacks)
        if mode == "rollback":  # after the step, before the checkpoint: a clean check covers the state it snapshots
            self.order = CallbackOrder.Optimizer + 5
        self.state_per_rank = spike is not None  # each rank's window of its own losses
        self._first, self._skipped, self._history, self._params, self._weights = {}, 0, {}, [], []
        self._with_grads = True
        self._values, self._pending, self._agreed_clean = {}, 0, False

    @property
    def produces(self):
        return {"skip": ("nonfinite_skipped",), "rollback": ("rollbacks",)}.get(self.mode, ())

    def attach(self, shared) -> None:
        if self.mode != "skip":  # no checkpoint holds weights trained on a bad loss
            shared.add_save_check(self._before_save)
        if self.mode == "rollback":
            shared.allow_rollbacks()

    def _losses(self, runner) -> dict:
        metrics = runner.loop.batch_metrics
        keys = self.keys if self.keys is not None else [k for k in metrics if "loss" in k]
        return {k: metrics[k] for k in keys if isinstance(metrics.get(k), torch.Tensor)}

    def _watches(self, key: str) -> bool:
        return key in self.keys if self.keys is not None else "loss" in key

    def on_stage_start(self, runner):
        if self.mode == "rollback":
            if runner.rollback is None:
                raise ValueError("NonFiniteLossCallback(mode='rollback') needs the run's rollback keeper "
                                 "(callbacks['rollback'], which the run adds by itself); do not replace it")
            self._params = [p for name, model in named(runner.unwrapped_model, "model").items()
                            for p in model.parameters()]

    def on_loader_start(self, runner):
        self._values, self._pending, self._first, self._skipped = {}, 0, {}, 0
        if self.mode == "rollback" and runner.loop.is_train_loader:  # first of the loader metrics (the CSV's columns)
            runner.loop.loader_metrics["rollbacks"] = float(runner.rollback.rollbacks_in_pass(runner))
            self._weights, self._with_grads = by_device(self._params), runner.scaler is None

    def on_batch_end(self, runner):
        loop = runner.loop
        if not loop.is_train_loader:
            return
        if self.mode == "skip":
            self._skip_if_bad(runner)
            return
        step, position, watched = loop.global_batch_step, loop.batch_step, self._values
        for key, loss in loop.batch_metrics.items():  # the detached losses, read at the next check
            seen = watched.get(key)
            if seen is None:  # first time since the last check: a list if this key is watched, else False
                seen = watched[key] = [] if self._watches(key) else False
            if seen is not False and isinstance(loss, torch.Tensor):
                seen.append((step, position, loss.detach()))
        if self._params:  # a rollback run's: the state after this batch's step
            self._keep_state(runner, step, position)
        self._pending += 1
        self._agreed_clean = False
        if self._pending == self.check_every:
            self.check(runner)

    def _keep_state(self, runner, step: int, position: int) -> None:
        """Keep the magnitudes of the weights and of the gradients held for the next step (not under a grad scaler,
        which skips the step of overflowing gradients): one fused ``torch._foreach_norm`` per device, on the device,
        read at the next check."""
        groups = self._weights
        if self._with_grads:  # held inside an accumulation group (a step resets them)
            grads = [p.grad for p in self._params if p.grad is not None]
            groups = groups + by_device(grads) if grads else groups
        norms = [norm for group in groups for norm in torch._foreach_norm(group, math.inf)]
        self._values.setdefault(STATE, []).append((step, position, norms))

    def on_loader_end(self, runner):
        if not runner.loop.is_train_loader:
            return
        if self.mode == "skip":
            runner.loop.loader_metrics["nonfinite_skipped"] = float(self._skipped)
            return
        if self._params:  # the state after the loader's last step (a partial accumulation group's, at its end)
            self._keep_state(runner, runner.loop.global_batch_step, runner.loop.batch_step)
        self._find(runner)  # a rollback asked for here ends the pass with the loader (the loop puts it back)
        if self.mode == "rollback":
            runner.loop.loader_metrics["rollbacks"] = float(runner.rollback.rollbacks_in_pass(runner))

    def check(self, runner) -> None:
        """Read the values since the last check (one host read; under several processes one all-reduce of an
        integer, skipped when no rank has had a train batch since the last clean one); at the first bad one,
        raise (``"stop"``) or roll back (``"rollback"``: the pass ends, :class:`~torchstage.callbacks.base.RollBack`);
        after a clean check a rollback run may snapshot."""
        if self.mode != "skip" and self._find(runner) is not None:
            raise RollBack()

    def _before_save(self, runner):
        """The check before a checkpoint write (registered with the runner's save): a rollback asked for here writes
        nothing (the pass ends after this batch); ``"stop"`` raises."""
        return None if self._find(runner) is None else "a rollback past a bad batch is under way"

    def _find(self, runner):
        """The check itself: None when every value since the last check is good (after which a rollback run may
        snapshot); at the first bad one raise (``"stop"``), or ask for a rollback and return its finding."""
        engine = runner.engine
        if engine.is_distributed and self._agreed_clean:  # the ranks run their train batches in step
            return None
        self._scan()
        rank = engine.rank
        # the first bad value: the earliest step; at one step a loss before the state (it is what went wrong)
        mine = min(((found[0], key == STATE, key, rank, *found[1:]) for key, found in self._first.items()),
                   default=None)
        keeper = runner.rollback if self.mode == "rollback" else None
        snapshot = keeper is not None and keeper.snapshot_due(runner)
        if engine.is_distributed:  # every rank must agree, so every rank acts at the same point
            earliest = mine[0] if mine is not None else NONE_SEEN
            # with it, whether a rank would snapshot now (a rollback run's): then every rank does
            agreed = engine.all_reduce_(torch.tensor([earliest, int(not snapshot)], device=engine.device), op="min")
            earliest, snapshot = (int(v) for v in agreed.tolist())
            snapshot = snapshot == 0
            if earliest == NONE_SEEN:
                self._agreed_clean = True
                self._clean(runner, keeper, snapshot)
                return None
            # which value, and on which rank: only after one was seen
            mine = min(found for found in engine.all_gather_object(mine) if found is not None)
        if mine is None:
            self._clean(runner, keeper, snapshot)
            return None
        step, _, key, origin, position, value, why = mine
        finding = {"step": step, "key": key, "rank": origin, "position": position, "value": value, "why": why,
                   "error": NonFiniteStateError if key == STATE else NonFiniteLossError if why is None else
                   LossSpikeError}
        what = describe(runner, finding)
        if keeper is not None:
            keeper.request(runner, finding, what, self.max_rollbacks)
            return finding
        raise finding["error"](
            f"{what}; the run stops so that no checkpoint holds weights trained on it (the last checkpoint is the "
            f"last {'finite' if why is None else 'good'} one). {_FIX}", origin_rank=origin)

    @staticmethod
    def _clean(runner, keeper, snapshot: bool) -> None:
        if snapshot:
            keeper.clean(runner)

    def _scan(self) -> None:
        """Find, per key, the first bad value kept since the last scan (one host read each); start anew. Without a
        spike rule only non-finite values are bad; with one, each finite loss is judged against the window of the
        losses accepted before it (the state is judged finite or not)."""
        values, self._values, self._pending = self._values, {}, 0
        for key, seen in values.items():
            if not seen or key in self._first:
                continue
            # one host read of them all; a non-scalar loss by its sum, which NaN/inf survive
            read = largest_magnitudes(seen) if key == STATE else \
                torch.stack([loss if loss.dim() == 0 else loss.sum() for _, _, loss in seen]).tolist()
            found = self._judge(key, read)
            if found is not None:
                index, why = found
                self._first[key] = (seen[index][0], seen[index][1], read[index], why)

    def _judge(self, key: str, read: list):
        """``(index, why)`` of the first bad value of ``read`` (``why`` None: non-finite), else None."""
        if self.spike is None or key == STATE:
            if all(map(math.isfinite, read)):
                return None
            return next(i for i, value in enumerate(read) if not math.isfinite(value)), None
        history = self._history.get(key)
        if history is None:
            history = self._history[key] = self.spike.history()
        for index, value in enumerate(read):
            if not math.isfinite(value):
                return index, None
            why = self.spike.judge(history, value)
            if why is not None:
                return index, why
        return None

    def _skip_if_bad(self, runner):
        losses = self._losses(runner)
        if not losses:
            return
        if self.spike is None:
            bad = torch.stack([~torch.isfinite(loss.detach()).all() for loss in losses.values()]).any()
            why = "non-finite " + "/".join(losses)
        else:  # judged on the host: the values are read now (mode="skip" syncs every batch anyway)
            read = torch.stack([loss.detach() if loss.dim() == 0 else loss.detach().sum()
                                for loss in losses.values()]).tolist()
            whys = [self._skip_judgement(key, value) for key, value in zip(losses, read)]
            why = "; ".join(w for w in whys if w)
            bad = torch.tensor(bool(why), device=runner.engine.device)
        flag = runner.engine.all_reduce_(bad.to(torch.int32).reshape(1), op="max")
        if not flag.item():  # the one host sync per batch of mode="skip"
            if self.spike is not None:
                for key, value in zip(losses, read):
                    self._history.setdefault(key, self.spike.history()).append(value)
            return
        self._skipped += 1
        runner.loop.batch_skipped = True  # the averaging and optimizer callbacks leave this batch out
        if runner.engine.is_main:
            logger.warning("skipped train batch %d of epoch %d (global batch %d): %s", runner.loop.batch_step,
                           runner.loop.epoch, runner.loop.global_batch_step, why or "a bad loss on another rank")

    def _skip_judgement(self, key: str, value: float):
        """Why a loss makes this batch skipped (mode="skip"), judged without keeping it; None if it is fine."""
        if not math.isfinite(value):
            return f"non-finite {key}"
        why = self.spike.judge(self._history.setdefault(key, self.spike.history()), value, keep=False)
        # kept in the window only once every rank agrees the batch is trained on
        return None if why is None else f"loss spike {key!r} {value:.4g}, {why}"

    def state_dict(self) -> dict:
        """The spike rule's windows of this rank (none without a spike rule)."""
        if not self._history:
            return {}
        return {"spike_windows": {key: list(history) for key, history in self._history.items()}}

    def load_state_dict(self, state: dict) -> None:
        if self.spike is not None:
            self._history = {key: self.spike.history(values) for key, values in state.get("spike_windows",
                                                                                           {}).items()}

    def merge_rank_states(self, states: list) -> dict:
        """On another number of processes the main rank keeps the first rank's windows (the others start anew)."""
        return states[0] if states else {}


_FIX = ("Lower the learning rate, clip gradients (grad_clip_norm=...), skip such batches with "
        "callbacks={'nonfinite': NonFiniteLossCallback(mode='skip')}, or roll back past them with "
        "NonFiniteLossCallback(mode='rollback')")


def describe(runner, finding: dict) -> str:
    """``non-finite loss: 'loss' was nan on rank 1 at stage 'main', epoch 2, loader 'train', batch 2 (global batch
    10)``, ``loss spike: 'loss' was 1.2e+08 (above 10 x its running median ...) on rank 1 at ...``, or ``non-finite
    weights or gradients after the step: ...`` (a finite loss whose gradient was not)."""
    seen = f" on rank {finding['rank']}" if runner.engine.is_distributed else ""
    value, why = finding["value"], finding["why"]
    what = (f"non-finite weights or gradients after the step: their largest magnitude was {value} though the loss "
            f"was finite (a gradient or an update was not)" if finding["key"] == STATE else
            f"non-finite loss: {finding['key']!r} was {value}" if why is None else
            f"loss spike: {finding['key']!r} was {value:.4g} ({why})")
    loop = runner.loop
    return (f"{what}{seen} at stage {loop.stage_key!r}, epoch {loop.epoch}, loader {loop.loader_key!r}, batch "
            f"{finding['position']} (global batch {finding['step']})")


def by_device(tensors: list) -> list:
    """``tensors`` (this rank's shards of sharded ones, detached) in lists of one device each, the empty left out."""
    groups = {}
    for tensor in tensors:
        tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if tensor.numel():
            groups.setdefault(tensor.device, []).append(tensor.detach())
    return list(groups.values())


def largest_magnitudes(seen: list) -> list:
    """Per ``(step, position, norms)`` kept by :meth:`NonFiniteLossCallback._keep_state`, the largest of its norms,
    NaN when one is (one host read per device)."""
    flat = [norm for _, _, norms in seen for norm in norms]
    by_place = {}
    for index, norm in enumerate(flat):
        by_place.setdefault(norm.device, []).append(index)
    read = [0.0] * len(flat)
    for indices in by_place.values():
        for index, value in zip(indices, torch.stack([flat[i].float() for i in indices]).tolist()):
            read[index] = value
    largest, start = [], 0
    for _, _, norms in seen:
        values, start = read[start:start + len(norms)], start + len(norms)
        largest.append(next((v for v in values if not math.isfinite(v)), max(values, default=0.0)))
    return largest
