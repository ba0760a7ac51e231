"""Training features in one run: a two-output model with a per-output criterion, bf16 autocast,
gradient accumulation and clipping, validation every 2 epochs, early stopping, timing, a valid
split made from one dataset, then evaluation and prediction.

    python scripts/training_features.py --logdir /tmp/features
    python scripts/training_features.py --check      # a smoke run: 2 batches per loader, 2 epochs
"""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import torchstage
from torchstage import EarlyStoppingCallback, Loss, Regularizer, SupervisedRunner


class Points(Dataset):
    """x in R^8; targets: a regression value and a 3-class label, as a dict keyed by output name."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        w = torch.randn(8, 4, generator=g)
        self.value, self.label = (self.x @ w[:, :1]).tanh(), (self.x @ w[:, 1:]).argmax(dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "targets": {"value": self.value[i], "label": self.label[i]}}


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 64), nn.ReLU())
        self.value, self.label = nn.Linear(64, 1), nn.Linear(64, 3)

    def forward(self, features):
        h = self.body(features)
        return {"value": self.value(h), "label": self.label(h), "hidden": h}


def main(argv=None):
    parser = argparse.ArgumentParser(description="torchstage training features")
    parser.add_argument("--logdir", default=None)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)

    torchstage.set_seed(0)
    model = TwoHeads()
    criterion = {
        "value": nn.MSELoss(),                                     # model output "value" vs targets["value"]
        "label": Loss(nn.CrossEntropyLoss(), weight=0.5),          # weighted term
        "hidden": Regularizer(lambda hidden: hidden.pow(2).mean(), weight=1e-3),  # reads output "hidden"
    }
    runner = SupervisedRunner()
    runner.train(
        model=model, criterion=criterion, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
        datasets={"batch_size": 32, "train": Points(args.samples), "valid_ratio": 0.2},
        num_epochs=args.epochs, amp="bf16", accumulation_steps=2, grad_clip_norm=1.0, valid_every=2,
        timeit=True, callbacks=[EarlyStoppingCallback(patience=2, min_delta=1e-3)],
        logdir=args.logdir, overwrite=True, seed=0, check=args.check)

    metrics = runner.evaluate_loader(runner.loaders["valid"])
    correct = total = 0
    for batch, outputs in zip(runner.loaders["valid"], runner.predict_loader(runner.loaders["valid"], to_cpu=True)):
        correct += (outputs["label"].argmax(dim=1) == batch["targets"]["label"]).sum().item()
        total += len(outputs["label"])
    print(f"valid loss {metrics['loss']:.4f} loss_value {metrics['loss_value']:.4f} "
          f"loss_label {metrics['loss_label']:.4f} accuracy {correct / total:.3f} epochs {runner.epoch}")
    return runner


if __name__ == "__main__":
    main()
