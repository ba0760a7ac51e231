"""Catalyst 22-style scripts (scripts/catalyst22/) run with only their imports changed and end with Catalyst 22.04's
numbers: the same weights bit for bit, the same losses.

The reference lines were recorded on real Catalyst 22.04 (torch 2.13.0+cpu, accelerate 0.19.0, OMP_NUM_THREADS=1)
with ``/tmp/catvenv/bin/python tests/catalyst/catalyst_reference.py scripts/catalyst22/<script>.py LOGDIR``.
"""
import os

from tests import helpers

#: The last lines each script printed on Catalyst 22.04. ``sha`` is a digest of every weight's bytes.
CATALYST_22_04 = {
    "custom_runner": ["predictions=4x(32, 10) traced_equal=True",  # the notebook's predict_loader and trace steps
                      "valid_losses=1.724142074585,1.110015660524,0.675058200955",
                      "valid_accuracy=0.820312500000 sha=e2fbfc8b42a3f50c sum=2.8508461313"],
    "gan": ["generated_mean=1.8083,-0.7325 loss_generator=0.296220155433 loss_discriminator=0.853792626411",
            "sha=8eb97485bbfd4761 sum=3.6360005387"],
    "overfit_fp16": ["train_loss=0.26700819 valid_loss=0.64489225 lr=0.0025 sha=e3933395be7afa77 "
                     "sum=-16.1709571216"],
    "irunner_checkpoint": ["valid_loss=0.055557176471 lr=0.05 sha=133af3b0fee241e9 sum=0.3765448323",
                           "checkpoints=model.0003.pth,model.0004.pth,model.best.pth,model.last.pth,"
                           "model.storage.json"],
}


def run_script(name, logdir):
    """The output lines of scripts/catalyst22/<name> run by torchstage on one thread."""
    result = helpers.run_script(os.path.join("catalyst22", name), logdir, env={"OMP_NUM_THREADS": "1"})
    return result.stdout.strip().splitlines()


def test_custom_runner_with_its_own_loader_hooks_matches_catalyst_bitwise(tmp_path):
    """handle_batch with self.engine.backward(loss); on_loader_start/on_loader_end of the runner compute the
    loader metrics (they were silently never called): the valid losses they wrote and the weights match; then
    predict_loader and utils.trace_model give the same predictions and trace as Catalyst's."""
    lines = run_script("custom_runner.py", tmp_path)
    assert lines[-3:] == CATALYST_22_04["custom_runner"]
    assert (tmp_path / "checkpoints" / "best.pth").exists()


def test_gan_backward_callbacks_run_before_either_optimizer_steps_as_in_catalyst(tmp_path):
    lines = run_script("gan.py", tmp_path)
    assert lines[-2:] == CATALYST_22_04["gan"]


def test_irunner_with_catalyst22_checkpoint_callback_matches_catalyst(tmp_path):
    """dl.IRunner's get_* parts, CPUEngine, get_loggers and a 22 CheckpointCallback(logdir, loader_key, metric_key,
    minimize, topk=2): the same weights and learning rate; the same top-2 epochs (3 and 4), named torchstage's way
    in the folder given."""
    lines = run_script("irunner_checkpoint.py", tmp_path)
    numbers, files = lines[-2:]
    assert numbers == CATALYST_22_04["irunner_checkpoint"][0]
    assert files == "checkpoints=best.pth,epoch-0003.pth,epoch-0004.pth,last.pth,metrics.json"
    # get_loggers()' CSVLogger(logdir=...): one row per epoch, in logdir/logs/ (Catalyst 22 wrote logdir/valid.csv)
    assert len((tmp_path / "logs" / "valid.csv").read_text().strip().splitlines()) == 1 + 4


def test_fp16_on_cpu_and_batch_overfit_give_catalysts_result(tmp_path):
    """fp16=True trains in float32 on a CPU and BatchOverfitCallback(train=3, valid=0.5) repeats the first batches
    for each loader's length, as Catalyst 22 does (before, torchstage autocast to bf16 and ran 3 steps an epoch:
    train_loss 1.1697 instead of 0.2670); the StepLR steps once per epoch in both."""
    lines = run_script("overfit_fp16.py", tmp_path)
    assert lines[-1:] == CATALYST_22_04["overfit_fp16"]
