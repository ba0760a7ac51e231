"""The resume's global-batch advice comes from the checkpoint's own record (per-process batch, data-parallel ranks,
accumulation): a change is said with both sizes and the linear-rule factor, and following it trains on; no advice
when the global batch is the same."""
import logging
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests import script_server
from tests.resume_helpers import ROOT, child_env, tiny_train_kwargs
from torchstage import SupervisedRunner, load_checkpoint
from torchstage.runner.global_batch import report_resume


def _record(per_process, data_parallel, world_size=None, accumulation=1):
    return {"per_process": per_process, "data_parallel": data_parallel, "accumulation": accumulation,
            "world_size": world_size or data_parallel}


@pytest.mark.parametrize("before, now, said", [
    (_record(16, 2), _record(32, 1), "written by 2 process(es), resumed by 1; the global batch size is 32 as before "
                                     "(32 per process x 1 now, 16 per process x 2 before): nothing to scale"),
    (_record(16, 2), _record(8, 4), "written by 2 process(es), resumed by 4; the global batch size is 32 as before "
                                    "(8 per process x 4 now, 16 per process x 2 before): nothing to scale"),
    (_record(16, 2), _record(8, 2, accumulation=2), None),  # the same world and global batch: nothing at all
], ids=["ddp-2x16-as-1x32", "fsdp-2x16-as-hsdp-4x8", "2x16-as-2x8-accumulating-2"])
def test_the_same_global_batch_gives_no_advice(caplog, before, now, said):
    caplog.set_level(logging.INFO, logger="torchstage")
    report_resume("last.pth", before, now)
    assert "scale what depends" not in caplog.text and "linear rule" not in caplog.text
    assert "WARNING" not in caplog.text
    assert (said in caplog.text) if said else caplog.text == "", caplog.text


def test_a_changed_global_batch_is_said_with_the_checkpoints_numbers(caplog):
    caplog.set_level(logging.INFO, logger="torchstage")
    report_resume("last.pth", _record(16, 2), _record(8, 2))  # 2 x 16 resumed as 2 x 8
    assert caplog.records[0].levelname == "WARNING"
    assert caplog.text.count("resume from") == 1 and ("resume from last.pth: the global batch size is 16 now (8 per "
                                                      "process), 32 before (16 per process x 2): scale what depends "
                                                      "on it, such as the learning rate (x0.5 by the linear rule") \
        in caplog.text, caplog.text


def test_the_same_world_and_batch_says_nothing(caplog):
    caplog.set_level(logging.INFO, logger="torchstage")
    report_resume("last.pth", _record(16, 2), _record(16, 2))
    assert caplog.text == ""


def _train(logdir, batch_size, lr=0.01, **overrides):
    kwargs = tiny_train_kwargs(str(logdir), **overrides)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    train = kwargs["loaders"]["train"]
    kwargs.update(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                  loaders={**kwargs["loaders"], "train": DataLoader(train.dataset, batch_size=batch_size,
                                                                    shuffle=True)})
    return SupervisedRunner().train(**kwargs)


def test_a_resume_on_a_smaller_batch_says_so_and_its_advice_trains_on(tmp_path, caplog):
    """1 x 8 resumed as 1 x 4 (nothing said before: the world size was the same); the advice (halve the learning
    rate, resume_lr='new') followed, the run trains to its end."""
    _train(tmp_path, batch_size=8, num_epochs=1)
    assert load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))["meta"]["global_batch"] == {
        "per_process": 8, "data_parallel": 1, "accumulation": 1, "world_size": 1}
    caplog.set_level(logging.INFO, logger="torchstage")
    _train(tmp_path, batch_size=4, lr=0.005, num_epochs=2, resume="last", resume_lr="new")
    assert "the global batch size is 4 now (4 per process), 8 before (8 per process x 1): scale what depends on " \
           "it, such as the learning rate (x0.5 by the linear rule, resume_lr='new' to pass it)" in caplog.text
    after = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))
    assert after["loop"]["global_epoch_step"] == 2 and after["optimizers"]["optimizer"]["param_groups"][0]["lr"] == 0.005


def test_accumulation_keeping_the_global_batch_gives_no_advice(tmp_path, caplog):
    _train(tmp_path, batch_size=8, num_epochs=1)
    caplog.set_level(logging.INFO, logger="torchstage")
    _train(tmp_path, batch_size=4, num_epochs=2, resume="last", accumulation_steps=2)
    assert "global batch" not in caplog.text and "linear rule" not in caplog.text


@pytest.mark.distributed
def test_ddp_2x16_resumed_as_1x32_keeps_the_global_batch_and_says_so(tmp_path):
    script = (f"import sys, torch\nfrom tests.runner.test_global_batch_advice import _train\n"
              f"_train({str(tmp_path)!r}, batch_size=int(sys.argv[1]), num_epochs=int(sys.argv[2]), "
              f"resume=sys.argv[3] or None, distributed=sys.argv[4] == '2', nprocs=int(sys.argv[4]))\n")
    def run(*args):
        done = script_server.run([sys.executable, "-c", script, *map(str, args)], env=child_env(), cwd=ROOT,
                                 timeout=240, merge=True)
        assert done.returncode == 0, done.stdout[-3000:]
        return done.stdout
    run(16, 1, "", 2)
    out = run(32, 2, "last", 1)
    assert "written by 2 process(es), resumed by 1; the global batch size is 32 as before (32 per process x 1 " \
           "now, 16 per process x 2 before): nothing to scale" in out, out[-3000:]
    assert "linear rule" not in out
