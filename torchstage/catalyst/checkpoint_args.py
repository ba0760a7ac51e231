"""Catalyst 22's ``CheckpointCallback(logdir, loader_key, metric_key, minimize, topk, mode, save_last, save_best,
resume_model, resume_runner, load_best_on_end)`` translated for torchstage's CheckpointCallback, noted once;
what torchstage does another way is refused with where it went."""
from torchstage.logging_setup import note_alias

_LAYOUT = ("torchstage writes last.pth, best.pth, epoch-NNNN.pth (top-k) and metrics.json into that folder, where "
           "Catalyst 22 wrote model.last.pth, model.best.pth, model.000N.pth and model.storage.json")


#: Added to the error of a period given as a string: Catalyst 22's second positional argument was its loader_key.
POSITIONAL_HINT = ("; Catalyst 22's CheckpointCallback(logdir, loader_key, metric_key, minimize) arguments go by "
                   "name here: CheckpointCallback(logdir, loader_key=..., metric_key=..., minimize=...)")


def catalyst22_checkpoint_args(logdir, loader_key, metric_key, minimize, mode, save_last, save_best,
                               resume_model, resume_runner) -> bool:
    """Whether Catalyst 22's arguments were given (then ``logdir`` is the checkpoint folder itself and the best
    epoch is judged by ``loader_key``/``metric_key``/``minimize``); TypeError/ValueError for what cannot be."""
    given = {k: v for k, v in (("loader_key", loader_key), ("metric_key", metric_key), ("minimize", minimize),
                               ("mode", mode), ("save_last", save_last), ("save_best", save_best)) if v is not None}
    if not given and resume_model is None and resume_runner is None:
        return False
    if resume_model is not None or resume_runner is not None:
        raise TypeError("CheckpointCallback(resume_model=/resume_runner=) is Catalyst 22's; torchstage resumes with "
                        "train(resume='path/to/last.pth') (weights, optimizer, loop position and RNG)")
    if logdir is None:
        raise TypeError("CheckpointCallback(loader_key=..., metric_key=...) needs logdir=<the checkpoint folder>, "
                        "as Catalyst 22's")
    if (loader_key is None) != (metric_key is None):
        raise TypeError(f"CheckpointCallback: give loader_key and metric_key together (the metric that picks the "
                        f"best epoch), got loader_key={loader_key!r}, metric_key={metric_key!r}")
    if metric_key is not None and minimize is None:
        raise TypeError(f"CheckpointCallback(metric_key={metric_key!r}) needs minimize=True or False: without it "
                        f"Catalyst 22 kept the highest value as the best, which a loss rarely means")
    if mode not in (None, "model", "runner"):
        raise ValueError(f"CheckpointCallback(mode={mode!r}): expected 'model' or 'runner'")
    if save_last is False or save_best is False:
        raise ValueError("CheckpointCallback(save_last=False/save_best=False): torchstage always writes last.pth "
                         "(resume) and best.pth; drop the argument")
    note_alias("CheckpointCallback(logdir, loader_key=, metric_key=, minimize=, topk=)",
               f"train(logdir=..., valid_loader=..., valid_metric=..., minimize_valid_metric=..., topk=...); "
               f"{_LAYOUT}; mode='model' and 'runner' both write the whole run (weights_only loadable)", version="22")
    return True
