"""Each kind of pass the loop starts (a new one, a resumed one, a rollback's filtered one), run twice: once
unhindered, once with its first forked DataLoader worker held inside fork() (where CPython gh-112275 deadlocks
one). Prints one JSON line per kind: whether both gave the same batches and the same random state after, and how
many times the hindered one's workers were started again. Usage: python stuck_resumed_passes.py FOLDER"""
import json
import logging
import os
import random
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, get_worker_info

from torchstage.data.loader_rng import capture_loader_rng
from torchstage.data.reshard import resume_shard
from torchstage.data.resume import filtered_pass, resume_after_samples, resume_iterator
from torchstage.data.skips import PassFilter
from torchstage.data.worker_start import started
from torchstage.rng import get_rng_state

HOLD = {"marker": None}  # the file whose absence holds the next forked child (the fork inherits this)


def hold_once():
    marker = HOLD["marker"]
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(3600)  # a child that never returns from fork()


os.register_at_fork(after_in_child=hold_once)


class Noisy(Dataset):
    """Each sample drawn anew in its worker: the batches show the worker seeds a start drew."""

    def __len__(self):
        return 40

    def __getitem__(self, index):
        return torch.tensor([float(index)]), torch.rand(1)


class NoisyStream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        for index in range(info.id, 40, info.num_workers):
            yield torch.tensor([float(index)]), torch.rand(1)


def loader(stream=False, own_generator=False):
    if stream:
        return DataLoader(NoisyStream(), batch_size=4, num_workers=2)
    sampler = RandomSampler(range(40), generator=torch.Generator().manual_seed(5)) if own_generator else None
    return DataLoader(Noisy(), batch_size=4, shuffle=sampler is None, sampler=sampler, num_workers=2)


def interrupted(made, skip=3):
    """What an interrupted pass leaves a resume: the pass's start state, the run's state after ``skip`` batches."""
    start = capture_loader_rng(made)
    batches = iter(made)
    for _ in range(skip):
        next(batches)
    torch.rand(3)  # the run draws on (dropout, augmentation) before its checkpoint
    state = get_rng_state()
    batches._shutdown_workers()
    return start, state


def dropping():
    return PassFilter({2: None, 5: None})


def new_pass(arm):
    made = loader(own_generator=True)
    arm()
    return started(made)


def resumed_by_index(arm, made=None, source=None, skip=3):
    made = loader() if made is None else made
    resume = interrupted(made)
    arm()
    return resume_iterator(made, skip, *resume, source)


def resumed_after_a_batch_size_change(arm):
    made = loader()
    resume = interrupted(made)
    arm()
    return resume_after_samples(made, 10, *resume)[0]


def resumed_on_another_world(arm):
    made = loader()
    arm()
    return resume_shard(made, [7, 3, 19, 11, 0, 25, 31, 2, 8])[0]


def filtered(arm, stream=False):
    made, pass_filter = loader(stream=stream), dropping()
    arm()
    return filtered_pass(made, lambda: pass_filter)


KINDS = {
    "new pass": new_pass,
    "resumed by index": resumed_by_index,
    "resumed by reading": lambda arm: resumed_by_index(arm, loader(stream=True)),
    "resumed after a batch-size change": resumed_after_a_batch_size_change,
    "resumed on another world": resumed_on_another_world,
    "rollback's filtered pass": filtered,
    "rollback's filtered pass by reading": lambda arm: filtered(arm, stream=True),
    "rollback's resumed pass": lambda arm: (lambda f: resumed_by_index(arm, source=lambda: f, skip=2))(dropping()),
}


class Count(logging.Handler):
    def __init__(self):
        super().__init__()
        self.again = 0

    def emit(self, record):
        self.again += "started again" in record.getMessage()


def run_kind(kind, folder):
    count = Count()
    logging.getLogger("torchstage").addHandler(count)
    results = []
    for marker in (None, os.path.join(folder, kind.replace(" ", "_").replace("'", ""))):
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        batches = KINDS[kind](lambda: HOLD.update(marker=marker))  # held from here on: this pass's first fork
        HOLD["marker"] = None
        results.append((torch.cat([torch.cat(batch, 1) for batch in batches]), get_rng_state()))
    logging.getLogger("torchstage").removeHandler(count)
    (plain, plain_rng), (held, held_rng) = results
    return {"kind": kind, "batches": len(plain), "same_batches": torch.equal(plain, held),
            "same_rng": plain_rng == held_rng, "held": os.path.exists(marker), "started_again": count.again}


if __name__ == "__main__":
    for name in KINDS:
        print(json.dumps(run_kind(name, sys.argv[1])), flush=True)
