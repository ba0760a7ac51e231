"""Checkpoints and resuming, end to end: train, stop in the middle of an epoch, resume exactly, load the best.

    python scripts/examples/checkpoints_resume.py /tmp/ckpt-demo --stop-at-batch 12   # stops, exit code 1
    python scripts/examples/checkpoints_resume.py /tmp/ckpt-demo                      # resumes and finishes
    torchstage checkpoint inspect /tmp/ckpt-demo/checkpoints/last.pth

The model class lives in this script (``__main__``): checkpoints hold plain tensors, so they load
into it from any other script too.
"""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Batch, Callback, Epoch, SupervisedRunner, load_model_weights, request_stop


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)


class StopAtBatch(Callback):
    """Stands in for a SIGTERM or a time limit: asks for a graceful stop after global train batch ``n``."""

    def __init__(self, n):
        self.n = n

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.n:
            request_stop(f"demo stop at batch {self.n}")


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(320, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(320, 1, generator=g)
    return {"train": DataLoader(TensorDataset(x[:256], y[:256]), batch_size=32, shuffle=True),
            "valid": DataLoader(TensorDataset(x[256:], y[256:]), batch_size=32)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--stop-at-batch", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Net()
    SupervisedRunner().train(
        model=model, criterion=nn.MSELoss(), optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
        loaders=data(), num_epochs=4, logdir=args.logdir,
        resume="last",                           # continue the run in logdir if there is one
        checkpoint_period=(Batch(5), Epoch(1)),  # last.pth every 5 train batches and every epoch
        topk=2,                                  # keep the 2 best epochs as epoch-NNNN.pth
        load_best_on_end=True,                   # the model ends with best.pth's weights
        callbacks=[StopAtBatch(args.stop_at_batch)] if args.stop_at_batch else None)

    best = Net()
    load_model_weights(best, f"{args.logdir}/checkpoints/best.pth")
    same = all(torch.equal(a, b) for a, b in zip(best.state_dict().values(), model.state_dict().values()))
    print(f"finished; the model holds the best weights: {same}")


if __name__ == "__main__":
    main()
