"""A Catalyst 20.12 custom runner, moved by changing the imports only.

Catalyst 20.12: ``from catalyst import dl, metrics``. The step is Catalyst's ``_handle_batch(batch)``; it
reads ``self.device``, steps the optimizer itself on train loaders and fills ``self.batch_metrics``.
Synthetic 8x8 "digits" stand in for MNIST so the script runs offline.

Run: python scripts/catalyst20/custom_runner.py [LOGDIR]
"""
import sys

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl, metrics
from torchstage import metrics

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-custom-runner"
torch.manual_seed(0)
prototypes = torch.rand(10, 1, 8, 8)
labels = torch.randint(0, 10, (2000,))
images = (prototypes[labels] + 0.3 * torch.randn(2000, 1, 8, 8)).clamp(0, 1)
loaders = {
    "train": DataLoader(TensorDataset(images[:1600], labels[:1600]), batch_size=32, shuffle=True),
    "valid": DataLoader(TensorDataset(images[1600:], labels[1600:]), batch_size=32),
}
model = torch.nn.Linear(8 * 8, 10)
optimizer = torch.optim.Adam(model.parameters(), lr=0.02)


class CustomRunner(dl.Runner):

    def predict_batch(self, batch):
        # model inference step
        return self.model(batch[0].to(self.device).view(batch[0].size(0), -1))

    def _handle_batch(self, batch):
        # model train/valid step
        x, y = batch
        y_hat = self.model(x.view(x.size(0), -1))

        loss = F.cross_entropy(y_hat, y)
        accuracy01, accuracy03, accuracy05 = metrics.accuracy(y_hat, y, topk=(1, 3, 5))
        self.batch_metrics.update(
            {"loss": loss, "accuracy01": accuracy01, "accuracy03": accuracy03, "accuracy05": accuracy05}
        )

        if self.is_train_loader:
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()


runner = CustomRunner()
# model training
runner.train(
    model=model,
    optimizer=optimizer,
    loaders=loaders,
    logdir=logdir,
    num_epochs=5,
    verbose=False,
    load_best_on_end=True,
    main_metric="accuracy01",
    minimize_metric=False,
)
# model inference
for prediction in runner.predict_loader(loader=loaders["valid"]):
    assert prediction.detach().cpu().numpy().shape[-1] == 10
# model tracing
traced_model = runner.trace(loader=loaders["valid"])
x = images[1600:1632].view(32, -1)
assert torch.allclose(traced_model(x), model(x))
print(f"valid accuracy01={runner.epoch_metrics['valid_accuracy01']:.3f}")
