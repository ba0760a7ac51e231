"""The stop request and its signal handling, in process: the first request wins, a signal becomes a request with the
shell's exit code, a second Ctrl-C interrupts at once, and handlers are put back. (How the ranks agree on a request
is the agreement channel's: tests/distributed/test_agreement.py.)"""
import os
import signal
import threading

import pytest

from torchstage.stop_request import RunStopped, SignalStop, clear_stop_request, request_stop, stop_requested


@pytest.fixture(autouse=True)
def clean():
    clear_stop_request()
    yield
    clear_stop_request()


def test_a_signal_becomes_a_request_with_the_shells_exit_code_and_the_handler_is_put_back():
    previous = signal.getsignal(signal.SIGUSR1)
    handlers = SignalStop((signal.SIGUSR1,))
    handlers.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        request = stop_requested()
        assert (request.reason, request.signum, request.exit_code) == ("SIGUSR1", signal.SIGUSR1,
                                                                       128 + signal.SIGUSR1)
    finally:
        handlers.restore()
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_a_second_ctrl_c_interrupts_at_once():
    handlers = SignalStop((signal.SIGINT,))
    handlers.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop_requested().exit_code == 130
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        handlers.restore()


def test_handlers_are_not_installed_outside_the_main_thread():
    previous = signal.getsignal(signal.SIGUSR1)
    thread = threading.Thread(target=SignalStop((signal.SIGUSR1,)).install)
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_run_stopped_exits_with_the_requests_code_and_says_how_to_go_on():
    stopped = RunStopped(request_stop("time limit", exit_code=3))
    assert stopped.code == 3
    assert str(stopped) == "training stopped gracefully (time limit); resume it with resume='last' (exit code 3)"
