"""The shared benchmark workload: Catalyst's tutorial regression (1e4 x 10, batch 32, Adam, MSE, MultiStepLR)."""
import logging
import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

NUM_SAMPLES, NUM_FEATURES, BATCH_SIZE, NUM_EPOCHS = 10_000, 10, 32, 8


def make_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(NUM_SAMPLES, NUM_FEATURES, generator=g), torch.rand(NUM_SAMPLES, generator=g)


def make_loader(X, y, num_workers: int = 1):
    return DataLoader(TensorDataset(X, y), batch_size=BATCH_SIZE, num_workers=num_workers)


def quiet(threads: int = 1) -> None:
    """``threads`` torch threads, torchstage's info logs and the tutorial's broadcast warning silenced."""
    torch.set_num_threads(threads)
    logging.getLogger("torchstage").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="Using a target size")


def benchmark_loaders(num_workers: int, threads: int = 1) -> dict:
    """The tutorial's train and valid loaders (the same data), after :func:`quiet`, as every overhead
    benchmark runs them."""
    quiet(threads)
    loader = make_loader(*make_data(), num_workers)
    return {"train": loader, "valid": loader}


def make_parts(seed: int = 0):
    """A fresh model, optimizer, scheduler and criterion, identical for every contender."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(NUM_FEATURES, 1)
    optimizer = torch.optim.Adam(model.parameters())
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [3, 6])
    return model, torch.nn.MSELoss(), optimizer, scheduler


def hand_written(loaders, num_epochs, model, criterion, optimizer, scheduler, checkpoint_path=None, inside=None):
    """The loop a careful user writes by hand: same work as the runner (loss averages, a checkpoint per epoch).

    ``inside``: a one-item list that gets the thread CPU seconds spent in the batch loops added to it."""
    for _ in range(num_epochs):
        for name, loader in loaders.items():
            training = name.startswith("train")
            model.train(training)
            total, count = torch.zeros((), dtype=torch.float64), 0
            with torch.set_grad_enabled(training):
                started = time.thread_time() if inside is not None else None
                for x, y in loader:
                    loss = criterion(model(x), y)
                    if training:
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                    total += loss.detach() * len(x)
                    count += len(x)
                if inside is not None:
                    inside[0] += time.thread_time() - started
            float(total / count)
        scheduler.step()
        if checkpoint_path is not None:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, checkpoint_path)
    return model


def hand_written_ddp(dataset, num_epochs: int, num_workers: int, checkpoint_path: str) -> None:
    """The DDP loop a careful user writes, in a torchrun world: DistributedSampler, DDP, Adam, loss sums
    all-reduced per loader, the scheduler and a rank-0 checkpoint per epoch."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    quiet()
    hand_written_ddp_in_group(dataset, num_epochs, num_workers, checkpoint_path)
    dist.destroy_process_group()


def hand_written_ddp_in_group(dataset, num_epochs: int, num_workers: int, checkpoint_path: str) -> None:
    """The body of :func:`hand_written_ddp`, in a process group that is already initialised."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=num_workers)
    model, criterion, optimizer, scheduler = make_parts()
    model = DistributedDataParallel(model)
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        for training in (True, False):
            model.train(training)
            sums = torch.zeros(2, dtype=torch.float64)
            with torch.set_grad_enabled(training):
                for x, y in loader:
                    loss = criterion(model(x), y)
                    if training:
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                    sums[0] += loss.detach() * len(x)
                    sums[1] += len(x)
            dist.all_reduce(sums)
            float(sums[0] / sums[1])
        scheduler.step()
        if dist.get_rank() == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, checkpoint_path)
    del model  # DDP's reducer freed after the group would join gloo's threads under the GIL (see scale.py)
