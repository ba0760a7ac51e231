"""Smoke and debug runs: a few batches per loader (``check=True``), the same batches every epoch (``overfit``)."""
import io
import itertools
import logging
import torch

from torchstage.arguments import ArgumentError, check_int
from torchstage.callbacks.base import Callback, CallbackOrder, CancelLoader, CancelStage
from torchstage.files.checkpoint_read import load_checkpoint
from torchstage.files.checkpoint_file import serialize
from torchstage.files.checkpoint_format import CheckpointError, checkpoint_path
from torchstage.one_or_many import named

logger = logging.getLogger("torchstage")


class LimitBatchesCallback(Callback):
    """Every loader yields at most ``num_batches`` batches per epoch.

    With ``same_batches=True`` (``train(overfit=...)``) the first ``num_batches`` batches of each loader
    are taken once and yielded again every epoch, so a model that can learn at all drives their loss
    toward zero. The loader is swapped for a short one at loader start: nothing else is iterated.
    """

    order = CallbackOrder.Internal
    name = "limit_batches"

    def __init__(self, num_batches: int, same_batches: bool = False):
        self.num_batches, self.same_batches = check_int("num_batches", num_batches), same_batches
        self._cache = {}

    @classmethod
    def for_overfit(cls, overfit) -> "LimitBatchesCallback":
        """``train(overfit=True)`` (one batch) or ``overfit=n``: the same first batches every epoch."""
        if overfit is not True and (isinstance(overfit, bool) or not isinstance(overfit, int) or overfit < 1):
            raise ArgumentError("overfit", f"must be True/False or the number of batches to repeat, >= 1, "
                                           f"got {overfit!r}")
        return cls(1 if overfit is True else overfit, same_batches=True)

    def attach(self, shared) -> None:
        if not self.same_batches:
            shared.add_batch_limit(self.num_batches)

    def on_experiment_start(self, runner):
        if self.same_batches and type(self) is LimitBatchesCallback and runner.engine.is_main \
                and runner.spec is not None and runner.spec.overfit is not False:
            logger.info(CATALYST_OVERFIT, runner.spec.overfit, self.num_batches)

    def on_loader_start(self, runner):
        if not self.same_batches:
            runner.loop.loader = _Limited(runner.loop.loader, self.num_batches)
            return
        key = (runner.loop.stage_key, runner.loop.loader_key)
        if key not in self._cache:
            self._cache[key] = list(itertools.islice(runner.loop.loader, self.num_batches))
        runner.loop.loader = self._cache[key]


class BatchOverfitCallback(LimitBatchesCallback):
    """Catalyst's per-loader overfitting (20.12 and 22 alike): ``BatchOverfitCallback(train=10, valid=0.5)``.

    An int is a number of batches, a float a share of the loader's batches; loaders not named take one. Each
    epoch the loader takes its first batches from a fresh pass and repeats them for its whole length, so an
    epoch has as many steps as without the callback, as in Catalyst 22.04, whose order this keeps exactly: with
    ``n`` batches, steps 1..n-1 take batches 0..n-2, then from step n on they cycle from batch 0 (step ``i``
    takes batch ``(i - n) % n``). ``train(overfit=n)`` is torchstage's spelling: the first batches once per epoch.
    """

    def __init__(self, **loader_batches):
        for loader, n in loader_batches.items():
            ok = (isinstance(n, int) and not isinstance(n, bool) and n >= 1) or (isinstance(n, float) and 0 < n <= 1)
            if not ok:
                raise ValueError(f"BatchOverfitCallback({loader}={n!r}): expected a number of batches >= 1 or a "
                                 f"share of the loader in (0, 1]")
        super().__init__(1, same_batches=True)
        self.loader_batches = loader_batches

    def on_loader_start(self, runner):
        n = self.loader_batches.get(runner.loop.loader_key, 1)
        length = len(runner.loop.loader)
        n = max(1, int(length * n)) if isinstance(n, float) else n
        runner.loop.loader = _Repeated(list(itertools.islice(runner.loop.loader, n)), length)


class _Repeated:
    """``length`` steps over ``batches`` in Catalyst 22's order (see :class:`BatchOverfitCallback`)."""

    def __init__(self, batches: list, length: int):
        self.batches, self.length = batches, length

    def __iter__(self):
        n = len(self.batches)
        return (self.batches[i - 1] if i < n else self.batches[(i - n) % n] for i in range(1, self.length + 1))

    def __len__(self):
        return self.length


class _Limited:
    """The first ``n`` batches of a fresh pass over ``loader``; has a length when the loader has one."""

    def __init__(self, loader, n: int):
        self.loader, self.n = loader, n
        self.sampler = getattr(loader, "sampler", None)

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.n)

    def __len__(self):
        return min(self.n, len(self.loader))


#: What ``train(check=True)`` says about Catalyst's counts (a smoke run: its numbers are no result to keep).
CATALYST_CHECK = ("check=True: %d epoch(s) x %d batch(es) per loader; Catalyst 22's check=True ran 3 epochs x 3 "
                  "batches, 20.12's 2 x 3: for those counts pass callbacks=[CheckRunCallback(num_batch_steps=3, "
                  "num_epoch_steps=3)] without check=True")
#: What ``train(overfit=...)`` says about Catalyst's meaning of ``overfit=True``.
CATALYST_OVERFIT = ("overfit=%r: the first %d batch(es) of each loader, the same ones once per epoch; Catalyst 22's "
                    "overfit=True repeated the first batch for each loader's whole length: "
                    "callbacks=[BatchOverfitCallback()] does that")


class CheckRunCallback(Callback):
    """``train(check=True)``: end each stage after ``num_epochs`` epochs, then verify a checkpoint round trip.

    ``num_batch_steps`` (default 3, as Catalyst 20.12) ends each loader after that many batches
    (``train(check=True)`` adds a 2-batch limit of its own); ``num_epoch_steps`` is 20.12's ``num_epochs``.
    At the end of the run the runner's state is serialized and loaded back with ``weights_only=True``;
    with a checkpoint callback, the ``last.pth`` it wrote is read back and loaded into the model, and its
    weights must equal the model's. A failure raises :class:`~torchstage.CheckpointError`.
    """

    order = CallbackOrder.External
    name = "check"

    def __init__(self, num_epochs: int = None, num_batch_steps: int = 3):
        num_epochs = 2 if num_epochs is None else num_epochs
        for name, value in (("num_epochs", num_epochs), ("num_batch_steps", num_batch_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"CheckRunCallback: {name} must be an integer >= 1, got {value!r}")
        self.num_epochs, self.num_batch_steps = num_epochs, num_batch_steps

    def on_batch_end(self, runner):
        if self.num_batch_steps is not None and runner.loop.batch_step >= self.num_batch_steps:
            raise CancelLoader()

    def on_experiment_start(self, runner):
        if runner.engine.is_main:
            where = (f"; checkpoints and logs go to {runner.spec.logdir} (a scratch folder: the real run's "
                     f"logdir stays untouched)" if runner.spec.logdir is not None else "")
            logger.info("check run: at most %d epoch(s) per stage, a few batches per loader%s", self.num_epochs,
                        where)
            if runner.spec.check:
                logger.info(CATALYST_CHECK, self.num_epochs, min(runner.shared.batch_limits + [self.num_batch_steps]))

    def on_stage_start(self, runner):
        runner.loop.num_epochs = min(runner.loop.num_epochs, self.num_epochs)  # progress and logs show the real count

    def on_epoch_end(self, runner):
        if runner.loop.epoch >= self.num_epochs and runner.loop.epoch < runner.loop.num_epochs:
            raise CancelStage()

    def on_experiment_end(self, runner):
        state = torch.load(io.BytesIO(serialize(runner.state_dict())), weights_only=True)
        _load_and_compare(runner, state, "the serialized runner state")
        folders = runner.shared.checkpoint_folders(runner.spec.logdir)
        if folders:
            runner.engine.barrier()  # the main rank has written last.pth
            path = checkpoint_path(folders[0], "last")
            _load_and_compare(runner, load_checkpoint(path), path)
        logger.info("check run passed: %d batch(es) trained, checkpoint reloaded into the model",
                    runner.loop.global_batch_step)


def _load_and_compare(runner, checkpoint: dict, what: str) -> None:
    models = named(runner.unwrapped_model, "model")
    before = {name: {k: v.detach().clone() for k, v in m.state_dict().items()} for name, m in models.items()}
    runner.load_state_dict(checkpoint, weights_only=True)
    for name, model in models.items():
        for key, value in model.state_dict().items():
            if not torch.equal(value, before[name][key]):
                raise CheckpointError(f"check run: {what} did not restore model {name!r}: {key!r} differs "
                                      f"from the trained weights")
