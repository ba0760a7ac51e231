"""torchmetrics, a torchdata StatefulDataLoader and an EMA of the weights in one classification run.

    python scripts/integrations.py LOGDIR            # add --resume to continue an interrupted run
    pip install 'torchstage[torchmetrics,torchdata]'
"""
import argparse

import torch
import torchmetrics
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from torchstage import Batch, EMACallback, Epoch, SupervisedRunner, TorchMetricsCallback


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + (x[:, 4] > 1).long()  # 3 classes
    # A StatefulDataLoader remembers where it stands: a run resumed from a mid-epoch checkpoint
    # continues its pass (workers and iterable datasets included) instead of skipping batches by index.
    loaders = {"train": StatefulDataLoader(TensorDataset(x[:1600], y[:1600]), batch_size=64, shuffle=True,
                                           num_workers=2),
               "valid": StatefulDataLoader(TensorDataset(x[1600:], y[1600:]), batch_size=256)}
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    metrics = torchmetrics.MetricCollection({
        "f1": torchmetrics.classification.MulticlassF1Score(num_classes=3, average="macro"),
        "accuracy": torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")})
    return SupervisedRunner().train(
        model=model, criterion=torch.nn.CrossEntropyLoss(), loaders=loaders,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
        callbacks={"metrics": TorchMetricsCallback(metrics),  # logs f1 and accuracy, exact across ranks
                   "ema": EMACallback(decay=0.95)},             # validation sees the averaged weights
        valid_metric="f1", minimize_valid_metric=False, num_epochs=args.epochs, logdir=args.logdir,
        checkpoint_period=(Batch(10), Epoch(1)), resume="last" if args.resume else None)


if __name__ == "__main__":
    main()
