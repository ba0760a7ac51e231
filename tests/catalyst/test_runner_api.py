"""Catalyst 22's runner API on torchstage: engines, loggers, BackwardCallback, CheckpointCallback's 22 arguments,
dl.IRunner, training without an optimizer, evaluate_loader(model=); each refusal names the argument."""
import json
import logging

import pytest
import torch
from torch import nn

import torchstage as dl
from tests.conftest import regression_loaders


def fit(runner=None, callbacks=None, num_epochs=2, model=None, **kwargs):
    torch.manual_seed(0)
    model = model or nn.Linear(4, 1)
    kwargs.setdefault("optimizer", torch.optim.SGD(model.parameters(), lr=0.1))
    kwargs.setdefault("loaders", regression_loaders())
    (runner or dl.SupervisedRunner()).train(model=model, criterion=nn.MSELoss(), num_epochs=num_epochs,
                                            callbacks=callbacks, **kwargs)
    return model


def test_cpu_engine_and_loggers_are_noted_once_and_used(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr("torchstage.logging_setup._noted", set())
    with caplog.at_level(logging.INFO, logger="torchstage"):
        engine = dl.CPUEngine()
        runner = dl.SupervisedRunner()
        fit(runner, engine=engine, logdir=tmp_path, loggers={"csv": dl.CSVLogger(logdir=str(tmp_path / "mine"))})
    assert runner.engine.device == torch.device("cpu")
    assert (tmp_path / "mine" / "logs" / "valid.csv").exists()  # the logger given replaced the default "csv"
    assert not (tmp_path / "logs" / "valid.csv").exists()
    assert caplog.text.count("dl.CPUEngine() is Catalyst 22's spelling; torchstage's is Engine(device='cpu')") == 1
    assert "train(loggers={...}) is Catalyst 22's spelling" in caplog.text
    assert not {"CPUEngine", "GPUEngine", "IRunner", "IRunnerError"} & set(dl.__all__)  # aliases, not exports


def test_catalyst_engine_names_work_with_isinstance_as_in_catalyst(tmp_path):
    """Catalyst 22 code asks ``isinstance(runner.engine, dl.CPUEngine)``: it raised TypeError (not a class)."""
    runner = dl.SupervisedRunner()
    fit(runner, engine=dl.CPUEngine(), logdir=tmp_path)
    assert isinstance(runner.engine, dl.CPUEngine) and not isinstance(runner.engine, dl.GPUEngine)
    assert isinstance(dl.Engine(device="cpu"), dl.CPUEngine) and not isinstance("cpu", dl.CPUEngine)
    assert type(dl.CPUEngine()) is dl.Engine  # calling it gives torchstage's own Engine


@pytest.mark.parametrize("kwargs, error, message", [
    ({"engine": "cpu"}, TypeError, r"engine must be a torchstage Engine .*got str"),
    ({"engine": dl.Engine(device="cpu"), "distributed": True}, ValueError,
     r"engine=\.\.\. sets the device of a one-process run; with distributed=True"),
    ({"loggers": [dl.CSVLogger()]}, TypeError, r"loggers must be a dict name -> logger callback, got list"),
    ({"loggers": {"mine": object()}}, TypeError, r"loggers\['mine'\] must be a torchstage logger callback"),
])
def test_bad_engine_or_loggers_fail_before_training(kwargs, error, message):
    with pytest.raises(error, match=message):
        fit(**kwargs)


def test_catalyst22_train_switches_translate_or_are_refused():
    runner = dl.SupervisedRunner()
    fit(runner, cpu=True, ddp=False)
    assert runner.engine.device == torch.device("cpu") and runner.spec.distributed is None
    with pytest.raises(TypeError, match=r"train\(hparams=\.\.\.\) is Catalyst 22's and has no torchstage meaning"):
        fit(hparams={"lr": 0.1})
    with pytest.raises(TypeError, match=r"both ddp= \(Catalyst 22's name\) and distributed="):
        fit(ddp=True, distributed=False)


def test_catalyst22_engine_arguments_and_distributed_engines_are_refused():
    with pytest.raises(TypeError, match=r"dl.CPUEngine\(\) takes no arguments.*train\(amp="):
        dl.CPUEngine(fp16=True)
    with pytest.raises(AttributeError, match=r"DistributedDataParallelEngine is Catalyst 22's.*distributed=True"):
        dl.DistributedDataParallelEngine


def plain_loop(accumulation, clip=None):
    """What Catalyst 22's BackwardCallback + OptimizerCallback(accumulation_steps) do, by hand: backward every
    batch (losses summed, not divided), clip, step and zero every ``accumulation`` train batches of the run."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer, count = torch.optim.SGD(model.parameters(), lr=0.1), 0
    for _ in range(2):
        for x, y in regression_loaders()["train"]:
            nn.functional.mse_loss(model(x), y).backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            count += 1
            if count % accumulation == 0:
                optimizer.step()
                optimizer.zero_grad()
    return model


@pytest.mark.parametrize("accumulation, clip", [(3, None), (1, 0.05)])
def test_backward_callback_then_a_step_only_optimizer_callback_is_catalyst22s_schedule(accumulation, clip):
    model = fit(callbacks=[dl.BackwardCallback("loss", grad_clip_fn="clip_grad_norm_" if clip else None,
                                               grad_clip_params={"max_norm": clip} if clip else None),
                           dl.OptimizerCallback("loss", accumulation_steps=accumulation)])
    expected = plain_loop(accumulation, clip)
    for key, value in expected.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert not torch.equal(model.weight, plain_loop(1).weight) or (accumulation, clip) == (1, None)


def test_backward_callback_logs_the_gradient_norm_and_refuses_bad_arguments():
    class Norms(dl.Callback):  # a batch logger's view: after the step callbacks
        def __init__(self):
            super().__init__(dl.CallbackOrder.Logging)
            self.norms = []

        def on_batch_end(self, runner):
            if runner.is_train_loader:
                self.norms.append(float(runner.batch_metrics["gradient/loss/norm"]))

    norms = Norms()
    fit(callbacks=[dl.BackwardCallback("loss", nn.utils.clip_grad_norm_, {"max_norm": 1e3}, log_gradient=True),
                   norms])
    assert len(norms.norms) == 2 * 4 and all(n > 0 for n in norms.norms)
    with pytest.raises(KeyError, match=r"BackwardCallback\(metric_key='nope'\) found no such loss.*\['loss'\]"):
        fit(callbacks=[dl.BackwardCallback("nope")])
    with pytest.raises(ValueError, match=r"grad_clip_fn='clip_norm'; expected a callable or one of"):
        dl.BackwardCallback("loss", grad_clip_fn="clip_norm")
    with pytest.raises(TypeError, match="grad_clip_params without grad_clip_fn"):
        dl.BackwardCallback("loss", grad_clip_params={"max_norm": 1})
    with pytest.raises(TypeError, match=r"OptimizerCallback\(grad_clip_fn=\.\.\.\) is Catalyst 22's argument, "
                                        r"which it never applied"):
        dl.OptimizerCallback("loss", grad_clip_fn="clip_grad_norm_")


def test_gan_losses_stepped_one_by_one_raise_what_backward_callbacks_avoid():
    """Why BackwardCallback exists (and a no-op one would be wrong): a generator loss that goes through the
    discriminator cannot back-propagate once the discriminator has stepped in place."""
    class Gan(dl.Runner):
        def handle_batch(self, batch):
            x, _ = batch
            fake = self.model["generator"](x)
            self.batch_metrics["loss_d"] = self.model["discriminator"](fake.detach()).mean()
            self.batch_metrics["loss_g"] = -self.model["discriminator"](fake).mean()

    def train(callbacks):
        torch.manual_seed(0)
        model = {"generator": nn.Linear(4, 4), "discriminator": nn.Sequential(nn.Linear(4, 8), nn.Tanh(),
                                                                               nn.Linear(8, 1))}
        optimizer = {k: torch.optim.Adam(m.parameters(), lr=0.01) for k, m in model.items()}
        Gan().train(model=model, optimizer=optimizer, loaders=regression_loaders(), callbacks=callbacks,
                    valid_loader="train", valid_metric="loss_g")

    steps = [dl.OptimizerCallback("loss_d", "discriminator"), dl.OptimizerCallback("loss_g", "generator")]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        train(steps)
    train([dl.BackwardCallback("loss_d"), dl.BackwardCallback("loss_g")] + steps)


def test_catalyst22_checkpoint_callback_judges_by_its_own_metric_in_the_folder_given(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    with caplog.at_level(logging.INFO, logger="torchstage"):
        fit(logdir=tmp_path / "run", num_epochs=3, callbacks=[
            dl.CheckpointCallback(str(folder), loader_key="train", metric_key="loss", minimize=False, topk=1)])
    summary = json.loads((folder / "metrics.json").read_text())
    assert (summary["valid_loader"], summary["valid_metric"], summary["minimize_valid_metric"]) == \
        ("train", "loss", False)
    losses = [e["metrics"]["train"]["loss"] for e in summary["history"]]
    assert summary["best"]["epoch"] == 1 + losses.index(max(losses)) == 1  # the highest train loss: epoch 1
    assert sorted(p.name for p in folder.iterdir()) == ["best.pth", "epoch-0001.pth", "last.pth", "metrics.json"]
    assert not (tmp_path / "run" / "checkpoints").exists()  # the callback given replaced the default one


@pytest.mark.parametrize("kwargs, message", [
    ({"period": "valid"}, r"period must be Batch\(n\), Epoch\(n\).*CheckpointCallback\(logdir, loader_key=\.\.\.,"),
    ({"loader_key": "valid", "metric_key": "loss"}, r"needs minimize=True or False"),
    ({"loader_key": "valid"}, r"give loader_key and metric_key together"),
    ({"resume_model": "x.pth"}, r"train\(resume='path/to/last.pth'\)"),
    ({"metric_key": "loss", "loader_key": "valid", "minimize": True, "save_best": False}, r"always writes"),
])
def test_catalyst22_checkpoint_arguments_that_cannot_work_are_refused(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        dl.CheckpointCallback("logs", **kwargs)


def test_irunner_runs_its_parts_and_counts_batch_step_across_the_run():
    seen = {}

    class Minimal(dl.IRunner):
        @property
        def num_epochs(self):
            return 2

        def get_loaders(self):
            return regression_loaders()

        def get_model(self):
            return nn.Linear(4, 1)

        def get_optimizer(self, model):
            return torch.optim.SGD(model.parameters(), lr=0.1)

        def get_callbacks(self):
            return {"backward": dl.BackwardCallback("loss"), "optimizer": dl.OptimizerCallback("loss")}

        def handle_batch(self, batch):
            x, y = batch
            self.batch_metrics["loss"] = nn.functional.mse_loss(self.model(x), y)
            seen[(self.epoch_step, self.loader_key, self.loader_batch_step)] = self.batch_step

    runner = Minimal()
    runner.run()
    assert runner.num_epochs == 2 and runner.global_epoch_step == 2
    # 4 train + 4 valid batches per epoch, counted across loaders and epochs as Catalyst 22 does
    assert seen[(1, "train", 1)] == 1 and seen[(1, "valid", 4)] == 8 and seen[(2, "valid", 4)] == 16
    assert runner.sample_step == 2 * 2 * 64
    assert dl.IRunnerError is dl.RunnerException
    with pytest.raises(NotImplementedError, match=r"must override get_loaders\(\) \(dl.IRunner\)"):
        dl.IRunner().run()


def test_training_needs_an_optimizer_but_evaluation_loaders_alone_do_not():
    model = nn.Linear(4, 1)
    before = model.weight.detach().clone()
    runner = dl.SupervisedRunner()
    runner.train(model=model, criterion=nn.MSELoss(), loaders={"valid": regression_loaders()["valid"]})
    assert torch.equal(model.weight, before) and runner.epoch_metrics["valid"]["loss"] > 0
    with pytest.raises(ValueError, match=r"SupervisedRunner needs optimizer=\.\.\.; got optimizer=None \(a stage "
                                         r"whose loaders are all evaluation loaders"):
        dl.SupervisedRunner().train(model=model, criterion=nn.MSELoss(), loaders=regression_loaders())


def test_evaluate_loader_takes_catalyst22s_model_argument():
    runner = dl.SupervisedRunner()
    model = fit(runner)
    other = nn.Linear(4, 1)
    loader = regression_loaders()["valid"]
    trained = runner.evaluate_loader(loader, model=model)["loss"]
    untrained = runner.evaluate_loader(loader, model=other, seed=1)["loss"]
    assert runner.model is other and untrained != trained
    with pytest.raises(dl.IRunnerError, match=r"callbacks\[0\]: a CheckpointCallback has nothing to save"):
        runner.evaluate_loader(loader, callbacks=[dl.CheckpointCallback("ckpt")])


def test_check_and_overfit_switches_say_how_they_differ_from_catalyst(caplog):
    """train(check=True) and train(overfit=True) keep torchstage's counts (a smoke run, a one-batch epoch) and say
    what Catalyst 22 ran and how to get it; with those callbacks the counts are Catalyst's."""
    with caplog.at_level(logging.INFO, logger="torchstage"):
        fit(check=True, num_epochs=5)
        fit(overfit=True)
    assert "check=True: 2 epoch(s) x 2 batch(es) per loader; Catalyst 22's check=True ran 3 epochs x 3 batches, " \
           "20.12's 2 x 3" in caplog.text
    assert "overfit=True: the first 1 batch(es) of each loader, the same ones once per epoch; Catalyst 22's " \
           "overfit=True repeated the first batch for each loader's whole length" in caplog.text
    runner = dl.SupervisedRunner()
    fit(runner, num_epochs=5, callbacks=[dl.CheckRunCallback(num_batch_steps=3, num_epoch_steps=3)])
    assert (runner.epoch, runner.global_batch_step) == (3, 9)
    runner = dl.SupervisedRunner()
    fit(runner, callbacks=[dl.BatchOverfitCallback()])
    assert runner.global_batch_step == 2 * 4  # the first batch, for the train loader's 4 steps, 2 epochs


def test_a_plain_runner_overriding_catalyst22_getters_is_refused_rather_than_ignored():
    class Getters(dl.SupervisedRunner):
        def get_loaders(self):
            return regression_loaders()

    with pytest.raises(TypeError, match=r"Getters overrides get_loaders, which Catalyst 22's dl.Runner.train\(\) "
                                        r"read its parts from.*derive from dl.IRunner"):
        fit(Getters())
