"""A StatefulDataLoader with 2 workers, killed with SIGKILL mid-epoch and resumed: the batches after the checkpoint
are exactly those of an uninterrupted run (sample ids recorded per rank), on 1 and 2 processes."""
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.helpers import ROOT, run

SCRIPT = ROOT / "tests" / "data" / "scripts" / "stateful_loader_run.py"
KILL_AT = 17  # last.pth at global batch 15


def _records(path):
    return [tuple(line.split()) for line in path.read_text().splitlines()]


@pytest.mark.distributed
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind,nproc", [("iterable", 1), ("iterable", 2), ("map", 2)])
def test_resumed_run_reads_exactly_the_remaining_batches(tmp_path, kind, nproc):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir(), killed.mkdir()
    with ThreadPoolExecutor(2) as pool:  # the uninterrupted and the killed run side by side
        ran = pool.submit(run, [SCRIPT, reference, kind], nproc=nproc, timeout=180)
        first = pool.submit(run, [SCRIPT, killed, kind], nproc=nproc, timeout=180, KILL_AT_BATCH=KILL_AT)
        ran, first = ran.result(), first.result()
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    # one process dies of the signal; two processes: the launcher ends with the killed rank's status
    assert first.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL, 1), first.stderr[-2000:]
    last = torch.load(killed / "checkpoints" / "last.pth", weights_only=True)
    loop = last["loop"]
    assert loop["global_batch_step"] == 15 and not loop["epoch_done"]
    states = last["callbacks"]["loader_state"]["per_rank"]
    assert len(states) == nproc and all(s["loader"] == "train" for s in states)
    resumed = run([SCRIPT, killed, kind, "last"], nproc=nproc, timeout=180)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "reading and dropping" not in resumed.stdout + resumed.stderr  # no replay of the done batches
    for rank in range(nproc):
        expected = _records(reference / f"ids-rank{rank}-first.txt")
        done = [r for r in expected if (int(r[0]), int(r[1])) <= (loop["epoch"], loop["loader_batch"])]
        remaining = expected[len(done):]
        assert _records(killed / f"ids-rank{rank}-resumed.txt") == remaining
        assert _records(killed / f"ids-rank{rank}-first.txt")[:len(done)] == done
    ids = [set(int(i) for r in _records(reference / f"ids-rank{rank}-first.txt") if r[0] == "1"
               for i in r[2].split(",")) for rank in range(nproc)]
    if kind == "iterable":  # each rank reads its own shard, every sample once per epoch
        assert set().union(*ids) == set(range(96)) and sum(map(len, ids)) == 96
    assert torch.equal(torch.load(reference / "checkpoints" / "last.pth", weights_only=True)["models"]["model"]["0.weight"],
                       torch.load(killed / "checkpoints" / "last.pth", weights_only=True)["models"]["model"]["0.weight"])


def test_prefetch_with_a_stateful_loader_is_refused():
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torch.utils.data import TensorDataset

    from torchstage import SupervisedRunner
    model = torch.nn.Linear(2, 1)
    loader = StatefulDataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
    with pytest.raises(ValueError, match="prefetch=True reads the next batch ahead"):
        SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(), loaders={"train": loader},
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1), valid_loader="train",
                                 prefetch=True)


def test_the_loader_state_callback_joins_the_chain_only_for_stateful_loaders():
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torch.utils.data import DataLoader, TensorDataset

    from torchstage import SupervisedRunner
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    for cls, expected in ((StatefulDataLoader, True), (DataLoader, False)):
        model = torch.nn.Linear(2, 1)
        runner = SupervisedRunner().train(model=model, criterion=torch.nn.MSELoss(),
                                          loaders={"train": cls(data, batch_size=4)}, valid_loader="train",
                                          optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        assert ("loader_state" in runner.callbacks) is expected
