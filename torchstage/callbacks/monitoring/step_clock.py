"""One rank's train batches split into data, compute and collective wait, from host clocks, with no collective and
no device sync.

- **data**: from the end of one train batch (after every callback) to the start of the next: the loader, the
  copy to the device and the batch-start events. The first batch of each loader is left out (workers starting).
- **wait**: the end of each backward pass, from the moment this rank has computed its last gradient to the
  moment the backward returns. Under DDP that is the time the gradient all-reduce keeps it waiting for the
  slowest rank (plus the transfer); alone it is about zero.
- **compute**: the rest of the batch (batch start to batch end, less the wait): forward, backward, the
  optimizer step and every callback.

So a rank that computes slowly shows a long compute time, and the others, which wait for it in the all-reduce,
show it as wait, not as compute. Timing the wait costs a forward hook per model, a gradient hook on its output
and two callbacks queued at the end of the backward pass: a few Python calls per step.
"""
import time

import torch

try:  # the autograd engine's queue of callbacks run when a backward pass ends (as DDP and FSDP use it)
    from torch.autograd import Variable
    _queue_callback = Variable._execution_engine.queue_callback
except (ImportError, AttributeError):  # pragma: no cover - every torch 2.x has it
    _queue_callback = None


class BackwardWait:
    """Seconds this rank waited at the end of its backward passes through ``models``, summed in :attr:`waited` (read
    and reset with :meth:`take`): from the moment the pass computed its last gradient to its end, after every other
    end-of-backward callback (DDP's, which waits for the all-reduce) has run.

    A forward hook on each model puts a gradient hook on its output (a tensor of this step, freed with its graph);
    when the backward pass reaches it, two callbacks are queued on the autograd engine: the first runs once every
    gradient is computed, before DDP's (queued later, when its last bucket was ready), the second after all of them.
    Nothing is attached to the parameters: a hook left on a parameter's gradient accumulator outlives the run, and
    freeing it while the interpreter exits can abort the process."""

    def __init__(self, models):
        self.waited = 0.0
        self._arrived = None
        self._queued = False
        self._handles = [model.register_forward_hook(self._forward) for model in models] \
            if _queue_callback is not None else []

    def _forward(self, module, inputs, output):
        tensor = _first_needing_grad(output)
        if tensor is not None:
            tensor.register_hook(self._reached)

    def _reached(self, grad):
        if not self._queued:
            try:
                _queue_callback(self._computed)
                self._queued = True
            except RuntimeError:  # a gradient computed outside a backward pass of the engine's: not timed
                pass

    def _computed(self):
        self._arrived = time.perf_counter()
        try:  # runs after the callbacks queued during the pass (DDP's finalize among them)
            _queue_callback(self._ended)
        except RuntimeError:
            self._ended()

    def _ended(self):
        self._queued = False
        if self._arrived is not None:
            self.waited += time.perf_counter() - self._arrived
            self._arrived = None

    def take(self) -> float:
        """The seconds waited since the last call."""
        waited, self.waited = self.waited, 0.0
        return waited

    def remove(self) -> None:
        """Take the hooks off the models (the user's models keep none of them after the run)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _first_needing_grad(output, depth: int = 0):
    """The first tensor that requires grad in a model's output (a tensor, or dicts, lists and tuples of them)."""
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if depth < 3 and isinstance(output, (dict, list, tuple)):
        for value in output.values() if isinstance(output, dict) else output:
            found = _first_needing_grad(value, depth + 1)
            if found is not None:
                return found
    return None


class StepClock:
    """Sums of one rank's data, compute and wait seconds over its train batches: per window (since the last
    :meth:`take`) and per loader (since :meth:`loader_start`)."""

    def __init__(self, wait: BackwardWait = None, clock=time.perf_counter):
        self.wait, self.clock = wait, clock
        self.window = [0.0, 0.0, 0.0, 0]  # data, step, wait seconds, batches
        self.loader = [0.0, 0.0, 0.0, 0]
        self._start = self._end = None

    def loader_start(self) -> None:
        """A train loader starts: its first batch's data time (workers starting) is not counted."""
        self._end = None
        self.loader = [0.0, 0.0, 0.0, 0]
        if self.wait is not None:
            self.wait.take()  # a backward outside the train batches (a callback's) is not theirs

    def batch_start(self) -> None:
        now = self._start = self.clock()
        if self._end is not None:
            data = now - self._end
            self.window[0] += data
            self.loader[0] += data

    def batch_end(self) -> None:
        now = self._end = self.clock()
        step = now - self._start if self._start is not None else 0.0
        waited = self.wait.take() if self.wait is not None else 0.0
        for sums in (self.window, self.loader):
            sums[1] += step
            sums[2] += waited
            sums[3] += 1
        self._start = None

    def take(self) -> tuple:
        """``(data, compute, wait, batches)`` of the window since the last call (compute: step less wait)."""
        data, step, waited, batches = self.window
        self.window = [0.0, 0.0, 0.0, 0]
        return data, max(0.0, step - waited), waited, batches

    def loader_sums(self) -> tuple:
        """``(data, compute, wait, batches)`` of the current train loader so far."""
        data, step, waited, batches = self.loader
        return data, max(0.0, step - waited), waited, batches
