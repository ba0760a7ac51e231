"""What a failing rank leaves behind for its launcher and for ``torchstage diagnose``: its error and position (see
:mod:`torchstage.launch.failures`) and, with several processes, the collectives it ran (written to the logdir).

A rank that leaves a distributed run on its own (``sys.exit`` in user code while its peers still train) is named
too, with the line it left from: its peers only see their connections close.
"""
import sys
import traceback

from torchstage.launch.failures import LEFT_THE_RUN, record_failure, where
from torchstage.launch.flight_recorder import TAIL, recent, write_dump
from torchstage.launch.terminate_hook import on_terminate


def record_run_failure(runner, exc: BaseException) -> None:
    """Record why this rank's run ends with ``exc`` (never raises: the run is failing already)."""
    if isinstance(exc, KeyboardInterrupt):
        return  # a signal: the launcher that sent it knows
    engine, position = runner.engine, runner.loop_position()
    collectives = recent() if engine.is_distributed else []
    if collectives:
        write_dump(getattr(runner.spec, "logdir", None), engine.rank, collectives)
    error = exc
    if isinstance(exc, SystemExit):
        if not engine.is_distributed:
            return  # one process that exits: nobody waits for it
        error = f"{LEFT_THE_RUN} SystemExit({exc.code!r}) raised at {left_from(exc)}, while the other ranks train"
        sys.stderr.write(f"torchstage: rank {engine.rank} {error} (at {where({'position': position})}); they will "
                         f"fail or wait for it\n")
        sys.stderr.flush()
    record_failure(engine.rank, error, position, collectives[-TAIL:])


def left_from(exc: BaseException) -> str:
    """``file:line in function`` where ``exc`` was raised (the innermost frame of its traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else "an unknown line"



def record_on_abort(runner):
    """Until the returned function is called, a rank that dies in C++ (gloo aborts the rank that received more
    than a collective expected) first writes its collectives and a failure record, as a failing rank does: the
    launcher and ``torchstage diagnose`` then compare its side too. A no-op in one process."""
    if not runner.engine.is_distributed:
        return lambda: None

    def last_word():
        engine, collectives = runner.engine, recent()
        write_dump(getattr(runner.spec, "logdir", None), engine.rank, collectives)
        record_failure(engine.rank, "aborted in C++ (std::terminate): the process group's error is the 'terminate "
                                    "called' line of its output", runner.loop_position(), collectives[-TAIL:])

    return on_terminate(last_word)
