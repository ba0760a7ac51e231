"""The hang watchdogs' notice board: what each rank's watchdog publishes in the process group's store (its last
position, where it stopped, its recent collectives) and reads back from the others' when it fires, with the
keys and the few rules of that exchange. Every read and write is best effort: a store that fails or is missing
leaves a rank to report alone.
"""
import json
import time

#: Firing ranks that read every rank's state from the store: rank 0 and the first few stopped outside a
#: collective (the ones the others wait for). The rest report only themselves: with thousands of ranks, each
#: reading every other's state would be N² reads of one store.
FULL_REPORTS = 4
_REPORTERS = "torchstage/watchdog/reporters"
_BEAT, _FIRED, _COLLECTIVES = ("torchstage/watchdog/beat{}", "torchstage/watchdog/fired{}",
                               "torchstage/watchdog/collectives{}")
#: The rank a full report found the others waiting for (and where it was), for the ranks that report only
#: themselves.
_HUNG = "torchstage/watchdog/hung"


def default_store():
    """The default process group's store (shared by all ranks), or None (this rank then reports alone)."""
    try:
        from torch.distributed import distributed_c10d  # the store is not public API; any failure: no store
        return distributed_c10d._get_default_store()
    except Exception:
        return None


class HangBoard:
    """The watchdogs' exchange through ``store`` (None: the default process group's) among ``world_size`` ranks."""

    def __init__(self, world_size: int, store=None):
        self.world_size = world_size
        self.store = store if store is not None else default_store()

    def post_beat(self, rank: int, info: dict) -> None:
        """``rank``'s position at its last progress."""
        self._publish(_BEAT.format(rank), info)

    def post_fired(self, rank: int, info: dict, collectives: list) -> None:
        """Where ``rank`` stopped when its watchdog fired, and the collectives it ran last."""
        self._publish(_FIRED.format(rank), info)
        self._publish(_COLLECTIVES.format(rank), collectives)

    def post_hung(self, rank, info) -> None:
        """What a full report found: the rank the others wait for (None: none stands out) and where it was."""
        self._publish(_HUNG, {"rank": rank, "info": info})

    def take_report_slot(self) -> bool:
        """True for the first :data:`FULL_REPORTS` ranks that ask (one atomic add on the store; True without one)."""
        try:
            return self.store is None or self.store.add(_REPORTERS, 1) <= FULL_REPORTS
        except Exception:
            return True

    def await_hung(self, deadline: float):
        """What a full report posted (:meth:`post_hung`), waiting for it until ``deadline``; None without it."""
        store = self.store
        try:
            while store is not None and not store.check([_HUNG]) and time.monotonic() < deadline:
                time.sleep(0.1)
            return json.loads(store.get(_HUNG)) if store is not None and store.check([_HUNG]) else None
        except Exception:
            return None

    def read_collectives(self, deadline: float) -> dict:
        """Rank -> the last collectives each firing watchdog posted, waiting until ``deadline`` for all ranks."""
        keys = [_COLLECTIVES.format(rank) for rank in range(self.world_size)]
        store = self.store
        if store is None:
            return {}
        try:
            while not all(store.check([key]) for key in keys) and time.monotonic() < deadline:
                time.sleep(0.1)
            return {rank: json.loads(store.get(key)) for rank, key in enumerate(keys) if store.check([key])}
        except Exception:
            return {}

    def read_positions(self) -> dict:
        """Rank -> where it stands: what its watchdog posted when it fired, else its last beat."""
        ranks, store = {}, self.store
        if store is None:
            return ranks
        try:
            for rank in range(self.world_size):
                for key in (_FIRED.format(rank), _BEAT.format(rank)):
                    if store.check([key]):
                        ranks[rank] = json.loads(store.get(key))
                        break
        except Exception:
            pass
        return ranks

    def _publish(self, key: str, info) -> None:
        if self.store is not None:
            try:
                self.store.set(key, json.dumps(info))
            except Exception:
                pass
