"""What the default chain's checkpoints cost on a model whose checkpoint is hundreds of MB: ``topk=0`` (the
default: ``last.pth`` and ``best.pth``) against ``topk=1`` (also ``epoch-NNNN.pth``, a copy of ``best.pth``).

A stack of ``Linear(2048, 2048)`` layers with Adam (about 100 MB of weights, 300 MB a checkpoint), a few
batches an epoch so that the checkpoints dominate, every epoch better than the last. Per run: wall time,
bytes the process wrote to storage (``/proc/self/io``, Linux), and the checkpoint folder's size at the end.
Contenders alternate; medians over repeats.
Usage: python scripts/bench/checkpoint_io.py [--repeats 3] [--layers 6] [--epochs 3]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402
from overhead import round_order  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from torchstage import SupervisedRunner  # noqa: E402

WIDTH, BATCHES, BATCH_SIZE = 2048, 4, 16


def written_bytes() -> int:
    """Bytes this process has caused to be sent to storage so far (0 where ``/proc/self/io`` is missing)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))
    except (OSError, StopIteration):
        return 0


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


def run(loaders, layers: int, epochs: int, topk: int, logdir: str) -> tuple:
    """One training run; (seconds, bytes written, bytes left in the checkpoint folder)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    before, start = written_bytes(), time.perf_counter()
    SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), optimizer=optimizer, loaders=loaders,
                             logdir=logdir, num_epochs=epochs, verbose=False, overwrite=True, topk=topk)
    seconds = time.perf_counter() - start
    return seconds, written_bytes() - before, folder_bytes(os.path.join(logdir, "checkpoints"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    workload.quiet(threads=torch.get_num_threads())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * BATCH_SIZE, WIDTH, generator=g)
    loader = DataLoader(TensorDataset(x, x.roll(1, dims=1)), batch_size=BATCH_SIZE)
    loaders = {"train": loader, "valid": loader}
    contenders = {"topk=0 (default)": 0, "topk=1": 1}
    results = {name: [] for name in contenders}
    for repeat in range(args.repeats):
        for name, topk in round_order(list(contenders.items()), repeat):
            with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as logdir:
                results[name].append(run(loaders, args.layers, args.epochs, topk, logdir))
    params = args.layers * (WIDTH * WIDTH + WIDTH)
    print(f"{args.layers} x Linear({WIDTH}, {WIDTH}): {params / 1e6:.1f} M parameters, {args.epochs} epochs, "
          f"{args.repeats} runs each")
    for name, runs in results.items():
        seconds, written, kept = (statistics.median(values) for values in zip(*runs))
        print(f"{name:>17}: {seconds:6.2f} s a run, {written / 2**20:7.0f} MiB written, "
              f"{kept / 2**20:6.0f} MiB of checkpoints kept")


if __name__ == "__main__":
    main()
