"""A Catalyst 22 custom runner (the customizing notebook's shape), moved by changing the import only.

Catalyst 22: ``from catalyst import dl``. ``handle_batch`` backpropagates with ``self.engine.backward(loss)`` and
steps the optimizer itself; the runner's own ``on_loader_start``/``on_loader_end`` keep sample-weighted means and
write them to ``self.loader_metrics``. Then the notebook's ``predict_loader`` and ``utils.trace_model`` steps. Synthetic 8x8 digits stand in for MNIST, unshuffled, so the run is the same
computation on Catalyst 22.04 and on torchstage (tests/catalyst/test_runner_parity.py compares them).

Run: python scripts/catalyst22/custom_runner.py [LOGDIR]
"""
import sys

import torch
from torch.nn import functional as F

from common import digit_loaders, fingerprint
import torchstage as dl  # was: from catalyst import dl
import torchstage as utils  # was: from catalyst import utils

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-custom-runner-22"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
valid_losses = []


class CustomRunner(dl.Runner):
    def on_loader_start(self, runner):
        super().on_loader_start(runner)
        self.sums, self.samples = {"loss": 0.0, "accuracy": 0.0}, 0

    def handle_batch(self, batch):
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        accuracy = (logits.argmax(dim=1) == y).float().mean()
        self.batch_metrics.update({"loss": loss, "accuracy": accuracy})
        for key in self.sums:
            self.sums[key] += self.batch_metrics[key].item() * len(x)
        self.samples += len(x)
        if self.is_train_loader:
            self.engine.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()

    def predict_batch(self, batch):
        return self.model(batch[0].to(self.engine.device))

    def on_loader_end(self, runner):
        for key, total in self.sums.items():
            self.loader_metrics[key] = total / self.samples
        if self.loader_key == "valid":
            valid_losses.append(self.loader_metrics["loss"])
        super().on_loader_end(runner)


runner = CustomRunner()
runner.train(
    model=model,
    optimizer=optimizer,
    loaders=digit_loaders(),
    logdir=logdir,
    num_epochs=3,
    valid_loader="valid",
    valid_metric="loss",
    minimize_valid_metric=True,
    verbose=False,
)
# the notebook's inference and post-processing steps
loaders = digit_loaders()
predictions = [logits.detach() for logits in runner.predict_loader(loader=loaders["valid"])]
batch = next(iter(loaders["valid"]))[0]
traced = utils.trace_model(model=runner.model.cpu(), batch=batch)
print(f"predictions={len(predictions)}x{tuple(predictions[0].shape)} traced_equal={torch.equal(traced(batch), model(batch))}")
print("valid_losses=" + ",".join(f"{v:.12f}" for v in valid_losses))
print(f"valid_accuracy={runner.epoch_metrics['valid']['accuracy']:.12f} {fingerprint(model)}")
