"""Resume at any world size: a run interrupted mid-epoch by N processes goes on with M, each sample of the
interrupted epoch trained once (apart from the padding that gives every rank as many batches).

Real gloo processes (tests/launch/scripts/world_run.py): 40 shuffled samples whose first feature is their id,
4 per batch per rank, a checkpoint every 2 train batches, every rank SIGKILLed one batch after one.
"""
import collections
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import script_server
from tests.resume_helpers import ROOT, child_env
from torchstage import load_checkpoint

SCRIPT = os.path.join(ROOT, "tests", "launch", "scripts", "world_run.py")
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]
#: (processes before, kill after global batch, processes after, padding of the resumed pass, epoch interrupted)
CASES = {"2 -> 3": (2, 13, 3, 0, 3), "3 -> 2": (3, 7, 2, 2, 2), "1 -> 2": (1, 13, 2, 0, 2)}


def run(logdir, nproc, resume=None, **env):
    args = [sys.executable, SCRIPT, str(logdir), str(nproc)] + ([resume] if resume else [])
    return script_server.run(args, env=child_env(**env), timeout=300, merge=True)


def seen(logdir, tag):
    rows = []
    for name in os.listdir(logdir):
        if name.startswith(f"seen-{tag}-rank"):
            rows += [json.loads(line) for line in open(os.path.join(logdir, name))]
    return rows


def case(base, name):
    before, kill_at, after, _, _ = CASES[name]
    logdir = base / name.replace(" -> ", "-to-")
    first = run(logdir, before, KILL_AT_BATCH=kill_at, TAG="first")
    survivor = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))["loop"]
    second = run(logdir, after, resume="last", TAG="second")
    return {"logdir": logdir, "first": first, "survivor": survivor, "second": second}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("worlds")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(case, base, name) for name in CASES}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_mid_epoch_resume_on_another_world_trains_each_sample_of_the_epoch_once(runs, name):
    before, kill_at, after, padding, epoch = CASES[name]
    result = runs[name]
    assert result["first"].returncode != 0  # killed
    loop = result["survivor"]
    assert (loop["epoch_done"], loop["global_batch_step"], loop["epoch"]) == (False, kill_at - 1, epoch)
    out = result["second"].stdout
    assert result["second"].returncode == 0, out[-3000:]
    assert f"written by {before} process(es), resumed by {after}; the global batch size is {4 * after} now (4 per " \
           f"process), {4 * before} before" in out, out[-3000:]
    ids = [i for row in seen(result["logdir"], "first") if row["epoch"] == epoch and row["batch"] < kill_at
           for i in row["ids"]]
    ids += [i for row in seen(result["logdir"], "second") if row["epoch"] == epoch for i in row["ids"]]
    counts = collections.Counter(ids)
    assert set(counts) == set(range(40))  # every sample of the epoch
    assert sum(counts.values()) - 40 == padding  # each once, apart from the padding of the resumed pass
    assert load_checkpoint(str(result["logdir"] / "checkpoints" / "last.pth"))["loop"]["global_epoch_step"] == 3


def test_a_train_pass_interrupted_after_its_last_batch_resumes_on_another_world(tmp_path):
    """Killed as the validation of epoch 2 starts, after the checkpoint of the train pass's last batch: the 3 processes
    that resume have no train batch left; the main rank holds the partial sums of the 2 that wrote it, and every rank
    still takes part in the loader's end alike (a mismatched all-reduce aborted such a resume)."""
    logdir = tmp_path / "run"
    first = run(logdir, 2, KILL_AT_VALID=2, TAG="first")
    assert first.returncode != 0
    loop = load_checkpoint(str(logdir / "checkpoints" / "last.pth"))["loop"]
    assert (loop["epoch_done"], loop["global_batch_step"], loop["loader"], loop["loader_batch"]) == (False, 10, "train", 5)
    second = run(logdir, 3, resume="last", TAG="second")
    assert second.returncode == 0, second.stdout[-3000:]
    assert not [row for row in seen(logdir, "second") if row["epoch"] == 2]  # nothing left of epoch 2's pass
    rows = [line.split(",") for line in (logdir / "logs" / "train.csv").read_text().splitlines()]
    header, epoch2 = rows[0], [row for row in rows[1:] if row[rows[0].index("epoch")] == "2"]
    reference = run(tmp_path / "whole", 2, TAG="whole")  # the same run, never interrupted
    assert reference.returncode == 0, reference.stdout[-3000:]
    whole = [line.split(",") for line in (tmp_path / "whole" / "logs" / "train.csv").read_text().splitlines()]
    loss = header.index("loss")
    assert float(epoch2[-1][loss]) == pytest.approx(float([r for r in whole[1:] if r[whole[0].index("epoch")] == "2"]
                                                          [-1][whole[0].index("loss")]), rel=1e-6)
