"""The overhead workload through peer frameworks, each only if installed (they are never dependencies).

Catalyst 22.04 (its last release) installs on Python 3.11 with torch 2.13 when its ``hydra-slayer``
dependency is added (``pip install --no-deps catalyst==22.4 hydra-slayer``), best in a separate virtual
environment with ``--system-site-packages``.

Each function trains ``workload.NUM_EPOCHS`` epochs on train + valid with the same model, loss,
optimizer and scheduler as the hand-written loop, averaging losses per loader and saving a checkpoint
per epoch where the framework does so by default.
"""
import importlib.util
import os

import torch

import workload


def available() -> dict:
    """Name -> runner function for every peer framework that imports here."""
    found = {}
    if importlib.util.find_spec("ignite"):
        found["ignite"] = run_ignite
    if importlib.util.find_spec("accelerate"):
        found["accelerate"] = run_accelerate
    if importlib.util.find_spec("lightning"):
        found["lightning"] = run_lightning
    if importlib.util.find_spec("catalyst"):
        found["catalyst 22"] = run_catalyst
    return found


def run_ignite(loaders, logdir):
    from ignite.engine import Events, create_supervised_evaluator, create_supervised_trainer
    from ignite.metrics import Loss
    model, criterion, optimizer, scheduler = workload.make_parts()
    trainer = create_supervised_trainer(model, optimizer, criterion)
    evaluator = create_supervised_evaluator(model, metrics={"loss": Loss(criterion)})

    @trainer.on(Events.EPOCH_COMPLETED)
    def _validate_and_save(engine):
        evaluator.run(loaders["valid"])
        scheduler.step()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   os.path.join(logdir, "ignite.pth"))

    trainer.run(loaders["train"], max_epochs=workload.NUM_EPOCHS)


def run_accelerate(loaders, logdir):
    from accelerate import Accelerator
    model, criterion, optimizer, scheduler = workload.make_parts()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model, optimizer, train, valid = accelerator.prepare(model, optimizer, loaders["train"], loaders["valid"])
    for _ in range(workload.NUM_EPOCHS):
        for name, loader in (("train", train), ("valid", valid)):
            training = name == "train"
            model.train(training)
            total, count = torch.zeros((), dtype=torch.float64), 0
            with torch.set_grad_enabled(training):
                for x, y in loader:
                    loss = criterion(model(x), y)
                    if training:
                        accelerator.backward(loss)
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                    total += loss.detach() * len(x)
                    count += len(x)
            float(total / count)
        scheduler.step()
        accelerator.save(accelerator.unwrap_model(model).state_dict(), os.path.join(logdir, "accelerate.pth"))


def run_lightning(loaders, logdir):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model, self.criterion, self.optimizer, self.scheduler = workload.make_parts()

        def training_step(self, batch, _):
            loss = self.criterion(self.model(batch[0]), batch[1])
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch, _):
            self.log("valid_loss", self.criterion(self.model(batch[0]), batch[1]), on_epoch=True)

        def configure_optimizers(self):
            return [self.optimizer], [self.scheduler]

    trainer = L.Trainer(max_epochs=workload.NUM_EPOCHS, accelerator="auto", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=logdir)
    trainer.fit(Module(), loaders["train"], loaders["valid"])


def run_catalyst(loaders, logdir):
    from catalyst import dl
    model, criterion, optimizer, scheduler = workload.make_parts()
    dl.SupervisedRunner().train(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                                loaders=loaders, logdir=os.path.join(logdir, "catalyst"),
                                num_epochs=workload.NUM_EPOCHS, valid_loader="valid", valid_metric="loss",
                                minimize_valid_metric=True, verbose=False)
