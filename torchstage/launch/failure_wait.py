"""What the launcher waits for after a rank was killed, before it stops the others: their failure records.

A killed rank's failure travels from peer to peer (each notices when a neighbour's connection closes, which that
neighbour's exit does), so the wait goes on while records and exits keep coming. A peer that never notices (it
waits in a recv from another survivor, or in a collective among the survivors that the dead rank had done its part
of) is then asked for a record through the failure folder; its hang watchdog answers with its collectives and where
its loop waits (see :mod:`torchstage.callbacks.safety.watchdog`).
"""
import time

from torchstage.launch.failures import ask_for_records, read_failures

#: The seconds without a new failure record or exit of the peers after which the wait for their records ends, and
#: the most it waits in all (the failure reaching them one by one).
RECORDS_QUIET, RECORDS_MOST = 2.0, 20.0
#: Seconds the live workers that wrote no record get to answer the launcher's request for one.
ASKED_MOST = 3.0


def await_records(procs, dead: int, folder: str, quiet: float = RECORDS_QUIET, most: float = RECORDS_MOST) -> dict:
    """The failure records in ``folder`` once every live worker of ``procs`` but ``dead`` wrote one or exited, or
    ``quiet`` seconds passed with no new record and no exit (a peer stuck in a collective), ``most`` in all."""
    start = changed = time.monotonic()
    seen = None
    while True:
        records = read_failures(folder)
        waiting = [p for p in procs if p.rank != dead and p.poll() is None and p.rank not in records]
        now = time.monotonic()
        if (len(records), len(waiting)) != seen:
            seen, changed = (len(records), len(waiting)), now
        if not waiting or now - changed > quiet or now - start > most:
            return records
        time.sleep(0.05)


def ask_the_silent(procs, dead: int, records: dict, folder: str, most: float = ASKED_MOST) -> dict:
    """The failure records once the live workers that wrote none were asked for one: until each answered or
    exited, ``most`` seconds at most (a rank without a watchdog, ``hang_timeout=None``, cannot answer)."""
    silent = [p for p in procs if p.rank != dead and p.poll() is None and p.rank not in records]
    if not silent:
        return records
    ask_for_records(folder, dead)
    deadline = time.monotonic() + most
    while True:
        records = read_failures(folder)
        if time.monotonic() > deadline or all(p.rank in records or p.poll() is not None for p in silent):
            return records
        time.sleep(0.05)
