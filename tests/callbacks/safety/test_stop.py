"""Graceful stop in one process: signals and request_stop() end the run after a batch, with a checkpoint."""
import logging
import os
import signal

import pytest
import torch

from torchstage import Callback, RunStopped, StopCallback, SupervisedRunner, load_checkpoint, request_stop
from torchstage.stop_request import SignalStop, clear_stop_request, stop_requested

from tests.resume_helpers import checkpoint_differences, tiny_train_kwargs


class At(Callback):
    """Calls ``action()`` after global train batch ``n``."""

    order = 500

    def __init__(self, n, action):
        self.n, self.action = n, action

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == self.n:
            self.action()


def test_request_stop_checkpoints_mid_epoch_and_resume_matches_an_uninterrupted_run(tmp_path):
    SupervisedRunner().train(**tiny_train_kwargs(tmp_path / "ref"))
    with pytest.raises(RunStopped) as stopped:
        SupervisedRunner().train(**tiny_train_kwargs(tmp_path / "run", callbacks=[
            At(17, lambda: request_stop("time limit", exit_code=3))]))
    assert stopped.value.code == 3 and stopped.value.request.reason == "time limit"
    loop = load_checkpoint(str(tmp_path / "run" / "checkpoints" / "last.pth"))["loop"]
    assert (loop["epoch"], loop["loader_batch"], loop["epoch_done"]) == (2, 7, False)
    SupervisedRunner().train(**tiny_train_kwargs(tmp_path / "run", resume="last"))
    assert checkpoint_differences(str(tmp_path / "ref" / "checkpoints" / "last.pth"),
                                  str(tmp_path / "run" / "checkpoints" / "last.pth")) == []


def test_sigterm_in_process_stops_and_restores_the_previous_handler(tmp_path, caplog):
    previous = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.WARNING, logger="torchstage"), pytest.raises(RunStopped) as stopped:
        SupervisedRunner().train(**tiny_train_kwargs(tmp_path, callbacks=[
            At(4, lambda: os.kill(os.getpid(), signal.SIGTERM))]))
    assert stopped.value.code == 143
    assert "graceful stop (SIGTERM) after stage 'main' epoch 1 batch 4 (global batch 4)" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is previous
    assert stop_requested() is None


def test_stop_without_logdir_still_stops_and_says_there_is_no_checkpoint(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="torchstage"), pytest.raises(RunStopped):
        SupervisedRunner().train(**tiny_train_kwargs(None, callbacks=[At(2, lambda: request_stop("test"))]))
    assert "no checkpoint (no logdir)" in caplog.text


def test_a_request_left_from_before_the_run_does_not_stop_it(tmp_path):
    request_stop("stale")
    runner = SupervisedRunner().train(**tiny_train_kwargs(tmp_path, num_epochs=1))
    assert runner.global_batch_step == 10


def test_load_best_on_end_is_skipped_after_a_stop(tmp_path):
    kwargs = tiny_train_kwargs(tmp_path, num_epochs=3, load_best_on_end=True, callbacks=[
        At(25, lambda: request_stop("test"))])
    with pytest.raises(RunStopped):
        SupervisedRunner().train(**kwargs)
    last = load_checkpoint(str(tmp_path / "checkpoints" / "last.pth"))["models"]["model"]
    assert all(torch.equal(v, last[k]) for k, v in kwargs["model"].state_dict().items())


def test_second_ctrl_c_interrupts_at_once():
    found = signal.getsignal(signal.SIGINT)  # Python's default_int_handler, or SIG_IGN when started in the background
    handlers = SignalStop([signal.SIGINT])
    handlers.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop_requested().exit_code == 130
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is found  # the handler found before, back in place
    finally:
        handlers.restore()
        clear_stop_request()


def test_first_request_wins():
    try:
        first = request_stop("a", exit_code=5)
        assert request_stop("b", exit_code=6) is first and stop_requested().reason == "a"
    finally:
        clear_stop_request()


@pytest.mark.parametrize("kwargs, message", [
    ({"check_every": 0}, "check_every must be None (about every check_period seconds) or an integer >= 1, got 0"),
    ({"check_every": 2.5}, "check_every must be None .* got 2.5"),
    ({"check_period": 0}, "check_period must be a number of seconds > 0, got 0"),
    ({"check_period": "1s"}, "check_period must be a number of seconds > 0, got '1s'"),
])
def test_bad_arguments_are_refused_with_what_was_given(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StopCallback(**kwargs)
