"""The Catalyst 22 README's GAN: two models, two criteria, and per loss a BackwardCallback and an
OptimizerCallback, so both losses back-propagate before either optimizer steps. Moved by changing the import only.

Catalyst 22: ``from catalyst import dl``. 2-D points stand in for MNIST, and the random latent vectors and label
noise that the README draws inside ``handle_batch`` come with each batch instead, so the run is the same
computation on Catalyst 22.04 and on torchstage (tests/catalyst/test_runner_parity.py compares them).

Run: python scripts/catalyst22/gan.py [LOGDIR]
"""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import fingerprint
import torchstage as dl  # was: from catalyst import dl

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-gan-22"
latent_dim, num_points, batch_size = 8, 1024, 64
generator_rng = torch.Generator().manual_seed(0)
real = torch.randn(num_points, 2, generator=generator_rng) * 0.2 + torch.tensor([2.0, -1.0])
latents = torch.randn(num_points, 2, latent_dim, generator=generator_rng)  # per point: discriminator's, generator's
label_noise = 0.05 * torch.rand(num_points, 2, 1, generator=generator_rng)
loaders = {"train": DataLoader(TensorDataset(real, latents, label_noise), batch_size=batch_size)}

torch.manual_seed(0)
generator = nn.Sequential(nn.Linear(latent_dim, 32), nn.LeakyReLU(0.2), nn.Linear(32, 2))
discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
model = nn.ModuleDict({"generator": generator, "discriminator": discriminator})
criterion = {"generator": nn.BCEWithLogitsLoss(), "discriminator": nn.BCEWithLogitsLoss()}
optimizer = {
    "generator": torch.optim.Adam(generator.parameters(), lr=0.003, betas=(0.5, 0.999)),
    "discriminator": torch.optim.Adam(discriminator.parameters(), lr=0.003, betas=(0.5, 0.999)),
}


class CustomRunner(dl.Runner):
    def predict_batch(self, batch):
        return self.model["generator"](batch[0].to(self.engine.device))

    def handle_batch(self, batch):
        real_points, latent, noise = batch
        batch_size = real_points.shape[0]
        # the discriminator learns generated (1) against real (0) points, on noisy labels
        generated_points = self.model["generator"](latent[:, 0]).detach()
        combined_points = torch.cat([generated_points, real_points])
        labels = torch.cat([torch.ones((batch_size, 1)), torch.zeros((batch_size, 1))]).to(self.engine.device)
        labels = labels + torch.cat([noise[:, 0], noise[:, 1]])
        combined_predictions = self.model["discriminator"](combined_points)
        # the generator learns to make the discriminator answer "real" (0)
        misleading_labels = torch.zeros((batch_size, 1)).to(self.engine.device)
        generated_points = self.model["generator"](latent[:, 1])
        generated_predictions = self.model["discriminator"](generated_points)
        self.batch = {
            "combined_predictions": combined_predictions,
            "labels": labels,
            "generated_predictions": generated_predictions,
            "misleading_labels": misleading_labels,
        }


runner = CustomRunner()
runner.train(
    model=model,
    criterion=criterion,
    optimizer=optimizer,
    loaders=loaders,
    callbacks=[
        dl.CriterionCallback(input_key="combined_predictions", target_key="labels",
                             metric_key="loss_discriminator", criterion_key="discriminator"),
        dl.BackwardCallback(metric_key="loss_discriminator"),
        dl.OptimizerCallback(optimizer_key="discriminator", metric_key="loss_discriminator"),
        dl.CriterionCallback(input_key="generated_predictions", target_key="misleading_labels",
                             metric_key="loss_generator", criterion_key="generator"),
        dl.BackwardCallback(metric_key="loss_generator"),
        dl.OptimizerCallback(optimizer_key="generator", metric_key="loss_generator"),
    ],
    valid_loader="train",
    valid_metric="loss_generator",
    minimize_valid_metric=True,
    num_epochs=10,
    verbose=False,
    logdir=logdir,
)
with torch.no_grad():
    samples = generator(torch.randn(2000, latent_dim, generator=torch.Generator().manual_seed(1)))
metrics = runner.epoch_metrics["train"]
print(f"generated_mean={samples.mean(0)[0]:.4f},{samples.mean(0)[1]:.4f} "
      f"loss_generator={metrics['loss_generator']:.12f} loss_discriminator={metrics['loss_discriminator']:.12f}")
print(fingerprint({"generator": generator, "discriminator": discriminator}))
