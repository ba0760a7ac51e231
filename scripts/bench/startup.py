"""Startup cost: ``import torch`` vs ``import torch, torchstage`` in fresh interpreters, and time to first batch.

Usage: python scripts/bench/startup.py [--repeats 7]
"""
import argparse
import statistics
import subprocess
import sys

FIRST_BATCH = """
import time, torch
from torch.utils.data import DataLoader, TensorDataset
import torchstage
from torchstage import Callback, CancelRun, SupervisedRunner
class Stop(Callback):
    def on_batch_end(self, runner):
        print(f"first_batch {time.perf_counter() - start:.4f}")
        raise CancelRun()
X, y = torch.rand(64, 10), torch.rand(64, 1)
loader = DataLoader(TensorDataset(X, y), batch_size=32)
model = torch.nn.Linear(10, 1)
optimizer = torch.optim.Adam(model.parameters())  # torch's first optimizer costs ~1 s of its own imports
start = time.perf_counter()
SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer,
                         loaders={"train": loader, "valid": loader}, callbacks=[Stop()])
"""


def timed(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", f"import time; t=time.perf_counter(); {code}; "
                          f"print(time.perf_counter()-t)"], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch_only, both = [], []
    for _ in range(args.repeats):  # alternate so both see the same machine state
        torch_only.append(timed("import torch"))
        both.append(timed("import torch; import torchstage"))
    added = [b - t for b, t in zip(both, torch_only)]
    print(f"import torch:              median {statistics.median(torch_only):.3f} s")
    print(f"import torch, torchstage:  median {statistics.median(both):.3f} s")
    print(f"torchstage adds:           median {statistics.median(added):.3f} s")
    firsts = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", FIRST_BATCH], capture_output=True, text=True, check=True)
        firsts.append(float(out.stdout.split("first_batch")[1].split()[0]))
    print(f"train() call to first batch end: median {statistics.median(firsts):.3f} s")


if __name__ == "__main__":
    main()
