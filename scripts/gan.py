"""A small GAN on a 2-D mixture of 8 gaussians: a Runner subclass with two models, two optimizers,
two schedulers and a criterion, all dicts keyed by name and checkpointed by name.

    python scripts/gan.py --logdir /tmp/gan --epochs 30
    python scripts/gan.py --logdir /tmp/gan --epochs 30 --nprocs 2 --strategy fsdp   # each model sharded
    python scripts/gan.py --logdir /tmp/gan --epochs 30 --nprocs 2 --strategy deepspeed   # each its ZeRO engine

Logs ``loss_d`` and ``loss_g`` per epoch (``logdir/logs/train.csv``) and prints the mean distance of
generated points to the nearest mixture mode, before and after training.
"""
import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchstage

LATENT = 8


def mixture(n: int, seed: int, modes: int = 8, radius: float = 2.0, std: float = 0.05) -> torch.Tensor:
    """``n`` points from ``modes`` gaussians evenly spaced on a circle."""
    g = torch.Generator().manual_seed(seed)
    angle = torch.randint(0, modes, (n,), generator=g) * (2 * math.pi / modes)
    centers = radius * torch.stack([angle.cos(), angle.sin()], dim=1)
    return centers + std * torch.randn(n, 2, generator=g)


def mode_distance(points: torch.Tensor, modes: int = 8, radius: float = 2.0) -> float:
    """Mean distance from each point to its nearest mode: ~0.06 for real data, ~2 for points at the origin."""
    angle = torch.arange(modes) * (2 * math.pi / modes)
    centers = radius * torch.stack([angle.cos(), angle.sin()], dim=1)
    return torch.cdist(points, centers).min(dim=1).values.mean().item()


def mlp(inputs: int, outputs: int, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden),
                         nn.LeakyReLU(0.2), nn.Linear(hidden, outputs))


class GANRunner(torchstage.Runner):
    """One discriminator step, then one generator step, per batch of real points."""

    produces = ("loss_d", "loss_g")

    def handle_batch(self, batch):
        (real,) = batch
        generator, discriminator = self.model["generator"], self.model["discriminator"]
        bce = self.criterion["bce"]
        ones = torch.ones(real.shape[0], 1, device=real.device)
        zeros = torch.zeros_like(ones)
        fake = generator(torch.randn(real.shape[0], LATENT, device=real.device))

        loss_d = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
        if self.is_train_loader:
            self.step(loss_d, self.optimizer["discriminator"])

        loss_g = bce(discriminator(fake), ones)
        if self.is_train_loader:
            self.step(loss_g, self.optimizer["generator"])
        self.batch_metrics.update(loss_d=loss_d.detach(), loss_g=loss_g.detach())

    def step(self, loss, optimizer):
        """Backward and step through the run's strategy, which applies its precision (amp=) and gradient sync."""
        strategy = self.engine.strategy
        strategy.zero_grad(optimizer)  # the generator's loss left gradients in the discriminator
        strategy.backward(loss, optimizer)
        strategy.optimizer_step(optimizer)

    def sample(self, n: int) -> torch.Tensor:
        """``n`` generated points, on the CPU."""
        generator = self.model["generator"]
        with torch.no_grad():
            return generator(torch.randn(n, LATENT, device=next(generator.parameters()).device)).cpu()


def main(argv=None) -> GANRunner:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default=None)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nprocs", type=int, default=None, help="train on this many processes (distributed=True)")
    parser.add_argument("--strategy", default="ddp", choices=("ddp", "fsdp", "deepspeed"),
                        help="with --nprocs: ddp, fsdp or deepspeed (each model its own engine)")
    parser.add_argument("--zero-stage", type=int, default=1, help="with --strategy deepspeed: the ZeRO stage (the "
                        "generator's loss also reaches the discriminator, which stages 2 and 3 refuse)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    models = {"generator": mlp(LATENT, 2), "discriminator": mlp(2, 1)}
    optimizers = {"generator": torch.optim.Adam(models["generator"].parameters(), lr=1e-3, betas=(0.5, 0.999)),
                  "discriminator": torch.optim.Adam(models["discriminator"].parameters(), lr=1e-3,
                                                    betas=(0.5, 0.999))}
    schedulers = {name: torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, args.epochs // 2), gamma=0.5)
                  for name, opt in optimizers.items()}
    loaders = {"train": DataLoader(TensorDataset(mixture(4096, seed=1)), batch_size=128, shuffle=True),
               "valid": DataLoader(TensorDataset(mixture(1024, seed=2)), batch_size=512)}

    runner = GANRunner()
    runner.model = models
    before = mode_distance(runner.sample(2000))
    runner.train(model=models, optimizer=optimizers, scheduler=schedulers, criterion={"bce": nn.BCEWithLogitsLoss()},
                 loaders=loaders, num_epochs=args.epochs, valid_metric="loss_g", logdir=args.logdir,
                 seed=args.seed, overwrite=True, distributed=True if args.nprocs else None, nprocs=args.nprocs,
                 strategy=torchstage.DeepSpeed(stage=args.zero_stage) if args.strategy == "deepspeed" else args.strategy)
    after = mode_distance(runner.sample(2000))
    print(f"mode distance: before {before:.3f} after {after:.3f}")
    return runner


if __name__ == "__main__":
    main()
