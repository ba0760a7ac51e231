"""A Catalyst 20.12 GAN: two models, two optimizers, two OptimizerCallbacks; moved by changing the import.

Catalyst 20.12: ``from catalyst import dl``. Small 2-D data stand in for MNIST; Catalyst's runner also
needs a validation loader to pick ``main_metric`` from, here the train loader (``valid_loader="train"``).

Run: python scripts/catalyst20/gan.py [LOGDIR]
"""
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-gan"
torch.manual_seed(0)
latent_dim = 8
real = torch.randn(1024, 2) * 0.2 + torch.tensor([2.0, -1.0])
generator = nn.Sequential(nn.Linear(latent_dim, 32), nn.LeakyReLU(0.2), nn.Linear(32, 2))
discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
model = {"generator": generator, "discriminator": discriminator}
optimizer = {
    "generator": torch.optim.Adam(generator.parameters(), lr=0.003, betas=(0.5, 0.999)),
    "discriminator": torch.optim.Adam(discriminator.parameters(), lr=0.003, betas=(0.5, 0.999)),
}
loaders = {"train": DataLoader(TensorDataset(real), batch_size=64, shuffle=True)}


class CustomRunner(dl.Runner):

    def _handle_batch(self, batch):
        (real_points,) = batch
        batch_metrics = {}
        batch_size = real_points.shape[0]

        # the discriminator learns real (1) against generated (0) points
        fake_points = self.model["generator"](torch.randn(batch_size, latent_dim).to(self.device)).detach()
        combined = torch.cat([fake_points, real_points])
        labels = torch.cat([torch.zeros((batch_size, 1)), torch.ones((batch_size, 1))]).to(self.device)
        predictions = self.model["discriminator"](combined)
        batch_metrics["loss_discriminator"] = F.binary_cross_entropy_with_logits(predictions, labels)

        # the generator learns to make the discriminator answer "real"
        generated = self.model["generator"](torch.randn(batch_size, latent_dim).to(self.device))
        predictions = self.model["discriminator"](generated)
        batch_metrics["loss_generator"] = F.binary_cross_entropy_with_logits(
            predictions, torch.ones((batch_size, 1)).to(self.device))

        self.batch_metrics.update(**batch_metrics)


runner = CustomRunner()
runner.train(
    model=model,
    optimizer=optimizer,
    loaders=loaders,
    callbacks=[
        dl.OptimizerCallback(optimizer_key="generator", metric_key="loss_generator"),
        dl.OptimizerCallback(optimizer_key="discriminator", metric_key="loss_discriminator"),
    ],
    valid_loader="train",
    main_metric="loss_generator",
    num_epochs=30,
    verbose=False,
    logdir=logdir,
)
with torch.no_grad():
    samples = generator(torch.randn(2000, latent_dim))
print(f"generated mean={samples.mean(0).tolist()} loss_generator={runner.epoch_metrics['train_loss_generator']:.3f}")
