"""Console output of a run: plain progress lines off a terminal, logs above bars, the callback table and the
resume line only where they belong."""
import io
import logging

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import tiny_run
from torchstage import Callback, ProgressBar


def train(logdir=None, **kwargs):
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    loaders = {"train": DataLoader(TensorDataset(x, y), batch_size=8),
               "valid": DataLoader(TensorDataset(x, y), batch_size=16)}
    return tiny_run(loaders=loaders, logdir=None if logdir is None else str(logdir), **kwargs)


@pytest.fixture
def console():
    """The torchstage logger on a stream, as a user's terminal would show it."""
    stream, log = io.StringIO(), logging.getLogger("torchstage")
    handler = logging.StreamHandler(stream)
    log.addHandler(handler)
    level, log.level = log.level, logging.INFO
    yield stream
    log.removeHandler(handler)
    log.setLevel(level)


def test_off_a_terminal_progress_is_plain_lines_at_each_quarter(console, capsys):
    train(num_epochs=2, verbose=True)  # pytest's stderr is not a terminal
    lines = console.getvalue().splitlines()
    train_lines = [line for line in lines if "* train:" in line]
    assert [line.split(": ", 1)[1].split(" batches")[0] for line in train_lines] == \
        ["2/8 (25%)", "4/8 (50%)", "6/8 (75%)"] * 2
    assert train_lines[0].startswith("[main] 1/2 * train: 2/8 (25%) batches, ") and "loss=" in train_lines[0]
    assert "\r" not in capsys.readouterr().err  # no redrawn bar fragments


class LogsMidLoader(Callback):
    def on_batch_end(self, runner):
        if runner.batch_step == 3 and runner.is_train_loader:
            self.handlers = [type(h).__name__ for h in logging.getLogger("torchstage").handlers]
            logging.getLogger("torchstage").info("a message in the middle of a loader")


def test_log_records_go_above_a_terminal_bar(capsys):
    log = logging.getLogger("torchstage")
    handler = logging.StreamHandler(__import__("sys").stdout)
    log.addHandler(handler)
    level, log.level = log.level, logging.INFO
    try:
        spy = LogsMidLoader()
        train(callbacks=[ProgressBar(plain=False), spy])
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert spy.handlers == ["_TqdmLoggingHandler"]  # tqdm.write: the bar is cleared, the line printed, the bar redrawn
    assert "\na message in the middle of a loader\n" in "\n" + capsys.readouterr().out
    assert log.handlers == []


def test_callback_table_only_when_verbose_and_a_resume_says_where(tmp_path, console):
    train(tmp_path, num_epochs=1)
    assert "callbacks of stage" not in console.getvalue()
    train(tmp_path, num_epochs=2, resume="last", verbose=True)
    text = console.getvalue()
    assert "callbacks of stage 'main':" in text
    assert (f"resuming from {tmp_path / 'checkpoints' / 'last.pth'} at stage 'main', epoch 1, batch 8 "
            f"(epoch complete)") in text
