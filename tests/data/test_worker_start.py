"""A pass whose forked DataLoader worker never starts (CPython gh-112275) is started again, whatever kind of pass
it is: a new one, a resumed one (by index, by reading, after a batch-size change, on another world) or a rollback's
filtered one, and it gives the batches and leaves the random state of an unhindered start."""
import json

import pytest

from tests.helpers import ROOT, run

KINDS = ["new pass", "resumed by index", "resumed by reading", "resumed after a batch-size change",
         "resumed on another world", "rollback's filtered pass", "rollback's filtered pass by reading",
         "rollback's resumed pass"]


@pytest.mark.waits  # it waits out each held worker's start limit (3 s)
@pytest.mark.timeout(300)
def test_every_kind_of_pass_with_a_worker_held_in_its_fork_starts_again_and_gives_the_unhindered_batches(tmp_path):
    script = ROOT / "tests" / "data" / "scripts" / "stuck_resumed_passes.py"
    done = run([script, tmp_path], timeout=240, TORCHSTAGE_WORKER_START_SECONDS=3)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = {line["kind"]: line for line in map(json.loads, done.stdout.splitlines())}
    assert list(found) == KINDS, done.stdout
    for kind, line in found.items():
        assert line["held"] and line["started_again"] >= 1, line  # a fork was held, and the pass started again
        assert line["same_batches"] and line["same_rng"] and line["batches"] > 0, line
    assert found["new pass"]["batches"] == 40 and found["resumed by index"]["batches"] == 28
    assert found["resumed after a batch-size change"]["batches"] == 30
    assert found["resumed on another world"]["batches"] == 9 and found["rollback's filtered pass"]["batches"] == 32
