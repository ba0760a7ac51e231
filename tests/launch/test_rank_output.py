"""The ranks' output around a failure: the error a traceback ends with, and the gate that holds the peers' echoes."""
from torchstage.launch.rank_output import OutputGate, alike, comparable, consequences, last_error

TRACE = ["Traceback (most recent call last):\n", '  File "x.py", line 3, in <module>\n', "    main()\n",
         "           ^^^^\n"]


def test_last_error_is_the_line_the_last_traceback_ends_with():
    assert last_error(["epoch 1\n"]) is None
    chained = [*TRACE, "KeyError: 'a'\n", "\n", "During handling of the above exception, another exception occurred:\n",
               "\n", *TRACE, "torchstage.files.checkpoint_format.CheckpointError: cannot resume: shape (17,)\n", "more output\n"]
    assert last_error(chained) == "torchstage.files.checkpoint_format.CheckpointError: cannot resume: shape (17,)"
    assert comparable("TypeError: <object at 0x7f3a2b4c5d60>") == "TypeError: <object at 0x...>"


def test_the_gate_holds_the_other_ranks_after_the_first_traceback_and_hands_them_over_as_consequences():
    gate, shown = OutputGate(), []
    say = lambda rank, text: gate.admit(rank, text, lambda: shown.append((rank, text)))  # noqa: E731
    say(0, "epoch 1\n")
    say(1, "epoch 1\n")
    for text in [*TRACE, "ValueError: bad\n"]:
        say(1, text)
    say(0, "[W gloo] Connection closed by peer\n")
    say(0, TRACE[0])
    say(0, "RuntimeError: Connection closed by peer [127.0.0.1]:5\n")
    assert [rank for rank, _ in shown] == [0, 1, 1, 1, 1, 1, 1] and shown[-1] == (1, "ValueError: bad\n")
    held = gate.take(cause=1)
    assert consequences(held) == ("The other ranks failed after it (consequences; their tracebacks are left out): "
                                  "rank 0: RuntimeError: Connection closed by peer [127.0.0.1]:5")
    assert len(shown) == 7  # the echoes are not printed


def test_a_handled_traceback_holds_the_others_only_for_a_while():
    gate, shown = OutputGate(hold_seconds=0.0), []
    gate.admit(0, TRACE[0], lambda: shown.append("trace"))
    gate.admit(1, "epoch 2\n", lambda: shown.append("epoch 2"))
    assert shown == ["trace"]
    gate.release_stale()  # no failure followed: printed after all, and the gate opens again
    gate.admit(1, "epoch 3\n", lambda: shown.append("epoch 3"))
    assert shown == ["trace", "epoch 2", "epoch 3"] and gate.origin is None


def test_the_failing_ranks_own_lines_held_behind_another_ranks_traceback_are_printed():
    gate, shown = OutputGate(), []
    gate.admit(0, TRACE[0], lambda: shown.append("handled"))
    gate.admit(1, "ValueError: the real failure\n", lambda: shown.append("real"))
    assert gate.take(cause=1) == {} and shown == ["handled", "real"]


def test_an_error_every_rank_raised_alike_is_no_consequence():
    """The same error on every rank (a mesh that does not divide the world) is one mistake met alike: those ranks are
    named, not listed as consequences with the message again."""
    same = [*TRACE, "ValueError: strategy=HSDP(replicate=3, shard=2): 6 ranks, but the world has 4\n"]
    held = {1: same, 2: list(same), 3: [*TRACE, "RuntimeError: Connection closed by peer\n"]}
    ranks, rest = alike(held, "ValueError: strategy=HSDP(replicate=3, shard=2): 6 ranks, but the world has 4")
    assert ranks == [1, 2] and list(rest) == [3]
    assert consequences(rest) == ("The other ranks failed after it (consequences; their tracebacks are left out): "
                                  "rank 3: RuntimeError: Connection closed by peer")
    assert alike(held, None) == ([], held)
