"""The ranks train on the same data: torchstage's workers draw the same module-level random data, and under any
launcher ranks whose datasets differ are refused before training, naming the loader, the ranks and the fix."""
import re
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, TensorDataset

from tests.helpers import run
from torchstage.data.rank_agreement import check_same_data, checked_dataset, fingerprint
from torchstage.launch import script_seed

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPT = SCRIPTS / "rank_data.py"


def printed(out: str, kind: str) -> dict:
    """Rank -> the values a rank printed on its ``kind`` lines."""
    return {int(m[1]): m[2].split() for m in re.finditer(rf"^(?:\[rank\d\]: )?{kind} (\d) (.*)$", out, re.M)}


def same_loss(run_loss: str, own_loss: str) -> bool:
    """The run's validation loss (batch means, weighted, summed over the ranks) is the final model's MSE on the data
    the rank holds, up to float32 rounding (the two sum in different orders); other data would be percents off."""
    return float(run_loss) == pytest.approx(float(own_loss), rel=1e-5, abs=0)


def torchrun(logdir, **env):
    return run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", SCRIPT, logdir], **env)


@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["script", "module"])
def test_unseeded_module_level_data_is_the_same_on_the_ranks_torchstage_starts(tmp_path, how):
    program = [SCRIPT] if how == "script" else ["-m", "tests.data.scripts.rank_data"]
    result = run([*program, tmp_path], nproc=2)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    sums = printed(out, "checksum")
    workers = {rank: s for rank, s in sums.items() if f"[rank{rank}]: checksum {rank}" in out}
    assert sorted(workers) == [0, 1] and workers[0] == workers[1], out[-3000:]
    valid = printed(out, "valid")
    assert sorted(valid) == [0, 1], out[-3000:]
    for rank, (run_loss, own_loss) in valid.items():  # validation saw one dataset: the one each rank holds
        assert same_loss(run_loss, own_loss), (rank, out[-3000:])


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_ranks_holding_different_data_fail_before_training_under_torchrun(tmp_path):
    result = torchrun(tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    assert "ValueError: the ranks hold different data" in out, out[-3000:]
    assert "loader 'train' (also read by loader 'valid'): items 0, 32, 63 of its 64 differ between ranks (rank 0: hash" in out
    assert "build the data from a fixed seed" in out and "pass datasets=" in out
    assert "build the data after `import torchstage`" in out  # followed in the test below
    assert "epoch 1/2" not in out  # refused before the first step


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_data_made_after_import_torchstage_is_the_same_on_every_rank_under_torchrun(tmp_path):
    """The refusal's advice, followed: torchrun's ranks are seeded alike when they import torchstage."""
    result = torchrun(tmp_path, AFTER_IMPORT=1)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    sums, valid = printed(out, "checksum"), printed(out, "valid")
    assert sorted(sums) == [0, 1] and sums[0] == sums[1], out[-3000:]
    assert sorted(valid) == [0, 1] and valid[0] == valid[1] and same_loss(*valid[0]), out[-3000:]


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_get_datasets_fn_that_reads_the_rank_is_refused_with_advice_about_itself(tmp_path):
    """torchstage seeds every rank alike before calling get_datasets_fn: data that still differs comes from the
    function itself, and the advice says so (not "pass get_datasets_fn", which the user does)."""
    result = run([SCRIPTS / "rank_datasets_fn.py", tmp_path], nproc=2)
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "ValueError: the ranks hold different data" in out, out[-3000:]
    assert "loader 'train': items 0, 16, 31 of its 32 differ between ranks" in out
    assert "torchstage called datasets['get_datasets_fn'] after seeding every rank alike" in out
    assert "pass datasets=" not in out and "epoch 1/1" not in out


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_ranks_holding_the_same_data_train_under_torchrun(tmp_path):
    result = torchrun(tmp_path, SEEDED=1)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    valid = printed(out, "valid")
    assert sorted(valid) == [0, 1] and valid[0] == valid[1] and same_loss(*valid[0]), out[-3000:]


class FakeEngine:
    """Two ranks: this one (rank 0) and a peer whose fingerprints are given."""
    is_distributed, world_size = True, 2

    def __init__(self, peer):
        self.peer = peer

    def all_gather_object(self, obj):
        self.gathered = obj
        return [obj, self.peer]


class Noisy(Dataset):
    """Items with a random transform, counting reads."""

    def __init__(self, n=10):
        self.n, self.reads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return {"x": torch.tensor([float(i)]) + torch.rand(1), "i": i}


def test_fingerprint_agrees_despite_random_transforms_and_leaves_no_trace():
    dataset = Noisy()
    state = torch.get_rng_state()
    first = fingerprint(dataset)
    assert first == fingerprint(dataset) and first[0] == 10 and first[1]
    assert dataset.reads == 0  # read through a copy: the dataset's own counters do not see the check
    assert torch.equal(torch.get_rng_state(), state)  # training's random stream is untouched
    assert fingerprint(Noisy(11))[0] == 11 and fingerprint(Noisy(0)) == (0, None)


def test_datasets_that_differ_are_named_with_their_ranks():
    data = TensorDataset(torch.arange(8.0))
    other = TensorDataset(torch.arange(8.0) + 1)
    check_same_data({"loader 'train'": data}, FakeEngine({"loader 'train'": fingerprint(data)}))  # agree: passes
    with pytest.raises(ValueError, match=r"loader 'valid': items 0, 4, 7 of its 8 differ between ranks "
                                         r"\(rank 0: hash \w+, rank 1: hash \w+\).*fixed seed"):
        check_same_data({"loader 'valid'": data}, FakeEngine({"loader 'valid'": fingerprint(other)}))
    with pytest.raises(ValueError, match=r"loader 'train' has rank 0: 8 samples, rank 1: 9 samples"):
        check_same_data({"loader 'train'": data}, FakeEngine({"loader 'train'": (9, "abc")}))


def test_iterable_datasets_and_user_sharded_loaders_are_not_checked():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    data = TensorDataset(torch.arange(8.0))
    assert checked_dataset(DataLoader(data)) is data
    assert checked_dataset(DataLoader(Stream())) is None
    sharded = DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=0))
    assert checked_dataset(sharded) is None and checked_dataset(sharded, built=True) is data
    assert checked_dataset([1, 2]) is None


@pytest.mark.parametrize("orig, argv, main_spec, expected", [
    (["py", "run.py", "a"], ["run.py", "a"], None, ["-m", script_seed.ENTRY, "run.py", "a"]),
    (["py", "-u", "-W", "ignore", "run.py"], ["run.py"], None, ["-u", "-W", "ignore", "-m", script_seed.ENTRY,
                                                                 "run.py"]),
    (["py", "-m", "pkg.train", "a"], ["/x/pkg/train.py", "a"], "pkg.train", ["-m", script_seed.ENTRY, "-m",
                                                                              "pkg.train", "a"]),
    (["py", "-c", "code", "a"], ["-c", "a"], None, ["-m", script_seed.ENTRY, "-c", "code", "a"]),
    (["py", "-uc", "code"], ["-c"], None, ["-uc", "code"]),  # combined in one word: run as given
])
def test_workers_start_through_the_seeding_entry(monkeypatch, orig, argv, main_spec, expected):
    main = type(sys)("__main__")
    main.__spec__ = None if main_spec is None else type("Spec", (), {"name": main_spec})()
    monkeypatch.setattr(sys, "orig_argv", orig)
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert script_seed.seeded_command(["python", *orig[1:]]) == ["python", *expected]


def test_the_entry_seeds_before_the_program_and_hides_its_own_frames(tmp_path):
    program = tmp_path / "program.py"
    program.write_text("import sys, torch\nprint(torch.rand(2).tolist(), sys.argv[1:], __name__)\n"
                       "def fail():\n    raise RuntimeError('the program failed')\nfail()\n")
    result = run(["-m", script_seed.ENTRY, program, "a"], **{script_seed.SEED_ENV: 5})
    torch.manual_seed(5)
    assert result.stdout.splitlines() == [f"{torch.rand(2).tolist()} ['a'] __main__"]
    assert result.returncode == 1 and "RuntimeError: the program failed" in result.stderr
    assert "seeded_entry" not in result.stderr and "runpy" not in result.stderr
    assert result.stderr.startswith(f'Traceback (most recent call last):\n  File "{program}", line 5')


def test_the_launch_seed_is_the_launching_process_s_and_one_per_job_across_nodes():
    from torchstage.launch.world import World
    assert script_seed.launch_seed(World(world_size=2, spawn=2, nnodes=1)) == torch.initial_seed()
    nodes = [World(world_size=4, spawn=2, nnodes=2, node_rank=n, master_addr="node1", master_port=29512)
             for n in (0, 1)]
    assert script_seed.launch_seed(nodes[0]) == script_seed.launch_seed(nodes[1])  # each node's launcher agrees
