"""Catalyst 22's README Optuna example, moved by changing the import only (synthetic data instead of MNIST).

``OptunaPruningCallback(loader_key="valid", metric_key="accuracy01", minimize=False, trial=trial)`` reports the
metric each epoch and prunes with the study's pruner; the objective returns ``trial.best_score``.

Run: python scripts/catalyst22/metrics_optuna.py [LOGDIR]
"""
import sys

import optuna
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchstage as dl  # was: from catalyst import dl
from metrics_report import report

logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs-metrics-optuna"
optuna.logging.set_verbosity(optuna.logging.WARNING)
torch.manual_seed(0)
prototypes = torch.rand(10, 1, 8, 8)
labels = torch.randint(0, 10, (1200,))
images = (prototypes[labels] + 0.5 * torch.randn(1200, 1, 8, 8)).clamp(0, 1)


def objective(trial):
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    num_hidden = int(trial.suggest_float("num_hidden", 8, 32, log=True))

    loaders = {
        "train": DataLoader(TensorDataset(images[:960], labels[:960]), batch_size=32),
        "valid": DataLoader(TensorDataset(images[960:], labels[960:]), batch_size=32),
    }
    torch.manual_seed(trial.number)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, num_hidden), nn.ReLU(), nn.Linear(num_hidden, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss()

    runner = dl.SupervisedRunner(input_key="features", output_key="logits", target_key="targets")
    runner.train(
        model=model,
        criterion=criterion,
        optimizer=optimizer,
        loaders=loaders,
        logdir=f"{logdir}/trial{trial.number}",
        callbacks={
            "accuracy": dl.AccuracyCallback(input_key="logits", target_key="targets", num_classes=10),
            "optuna": dl.OptunaPruningCallback(loader_key="valid", metric_key="accuracy01", minimize=False,
                                               trial=trial),
        },
        num_epochs=3,
        verbose=False,
    )
    score = trial.best_score
    return score


study = optuna.create_study(
    direction="maximize",
    sampler=optuna.samplers.TPESampler(seed=0),
    pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0, interval_steps=1),
)
study.optimize(objective, n_trials=4, timeout=300)
trials = {f"trial{t.number}": t.value if t.value is not None else -1.0 for t in study.trials}
pruned = [t.number for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
report({"best_value": study.best_value, **trials}, pruned=pruned,
       steps={t.number: sorted(t.intermediate_values) for t in study.trials})
