"""Peak memory: the tutorial workload by hand and through torchstage, each in a fresh interpreter.

Reports the peak resident set size of each process (and the peak CUDA allocation on a GPU); medians
over repeats. Usage: python scripts/bench/memory.py [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = """
import json, logging, resource, sys, tempfile, warnings
sys.path.insert(0, {here!r})
import torch, workload
warnings.filterwarnings("ignore")
logging.getLogger("torchstage").setLevel(logging.WARNING)
X, y = workload.make_data()
loader = workload.make_loader(X, y, num_workers=0)
loaders = {{"train": loader, "valid": loader}}
model, criterion, optimizer, scheduler = workload.make_parts()
with tempfile.TemporaryDirectory() as logdir:
    if {which!r} == "torchstage":
        from torchstage import SupervisedRunner
        SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                                 loaders=loaders, logdir=logdir, num_epochs=workload.NUM_EPOCHS)
    else:
        import torchstage  # the import itself is not what is compared
        workload.hand_written(loaders, workload.NUM_EPOCHS, model, criterion, optimizer, scheduler,
                              checkpoint_path=logdir + "/hand.pth")
cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
print(json.dumps({{"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cuda_mb": cuda / 2**20}}))
"""


def measure(which: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(here=HERE, which=which)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {"hand-written": [], "torchstage": []}
    for _ in range(args.repeats):
        for which in results:
            results[which].append(measure(which))
    base = statistics.median(r["rss_mb"] for r in results["hand-written"])
    for which, runs in results.items():
        rss = statistics.median(r["rss_mb"] for r in runs)
        cuda = statistics.median(r["cuda_mb"] for r in runs)
        print(f"{which:>14}: peak RSS {rss:7.1f} MiB (+{rss - base:5.1f})  peak CUDA {cuda:7.1f} MiB")


if __name__ == "__main__":
    main()
