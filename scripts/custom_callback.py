"""A user callback: stop the run once the validation loss is below a target (a cancel exception, no flags).

Run: python scripts/custom_callback.py
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, CallbackOrder, CancelRun, SupervisedRunner


class StopAtLoss(Callback):
    """Ends the run when ``valid`` loss drops below ``target``; runs after the metrics are averaged."""

    order = CallbackOrder.External

    def __init__(self, target: float):
        self.target = target

    def on_epoch_end(self, runner):
        if runner.epoch_metrics["valid"]["loss"] < self.target:
            raise CancelRun()


torch.manual_seed(0)
X = torch.rand(1024, 3)
y = X @ torch.tensor([[1.0], [-2.0], [0.5]])
loader = DataLoader(TensorDataset(X, y), batch_size=32)
model = torch.nn.Linear(3, 1)
runner = SupervisedRunner()
runner.train(model=model, criterion=torch.nn.MSELoss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
             loaders={"train": loader, "valid": loader}, num_epochs=100, callbacks=[StopAtLoss(1e-3)])
print(f"stopped after epoch {runner.epoch} with valid loss {runner.epoch_metrics['valid']['loss']:.5f}")
