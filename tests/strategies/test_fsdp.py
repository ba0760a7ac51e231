"""strategy="fsdp" on 2 and 4 gloo processes: DDP's weights, the user's optimizer rebound, sharded checkpoints
that resume bitwise after kill -9 and load on another world size."""
import json
import os
import sys

import pytest
import torch

from tests import script_server
from tests.helpers import run as run_script, script_env
from tests.resume_helpers import EXACT_KEYS, ROOT, differences
from torchstage.files.checkpoint_read import load_checkpoint

pytestmark = pytest.mark.distributed

SCRIPT = os.path.join(ROOT, "tests", "strategies", "scripts", "fsdp_run.py")
#: Settings shared by the runs compared with each other: mid-epoch checkpoints, clipping, accumulation.
COMMON = {"PERIOD": 2, "CLIP": 0.5, "ACC": 2}


def launch(logdir, resume=None, timeout=400, **env):
    args = [sys.executable, SCRIPT, str(logdir)] + ([str(resume)] if resume else [])
    env = script_env(**env)
    proc = script_server.run(args, env=env, cwd=ROOT, timeout=timeout, merge=True)
    reports = {}
    for name in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []:
        if name.startswith("report-rank"):
            with open(os.path.join(logdir, name)) as f:
                reports[int(name[len("report-rank"):-len(".json")])] = json.load(f)
    return {"code": proc.returncode, "out": proc.stdout, "reports": reports, "logdir": logdir}


RUNS = {"fsdp2": {"STRATEGY": "fsdp-units", **COMMON}, "ddp2": {"STRATEGY": "ddp", **COMMON},
        "fsdp1": {"STRATEGY": "fsdp", "NPROC": 1, "EPOCHS": 1},
        "fsdp4": {"STRATEGY": "fsdp-units", "NPROC": 4, "EPOCHS": 1, **COMMON},
        "ddp4": {"STRATEGY": "ddp", "NPROC": 4, "EPOCHS": 1, **COMMON}}


class Runs(dict):
    """The reference runs, each started the first time a test asks for it."""

    def __init__(self, base, table=None):
        super().__init__()
        self.base, self.table = base, RUNS if table is None else table

    def __missing__(self, name):
        run = launch(self.base / name, **self.table[name])
        assert run["code"] == 0, run["out"][-3000:]
        self[name] = run
        return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("fsdp"))


def final(run):
    return load_checkpoint(os.path.join(run["logdir"], "checkpoints", "last.pth"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("procs", [2, 4])
def test_fsdp_weights_equal_ddp_weights(runs, procs):
    fsdp, ddp = runs[f"fsdp{procs}"]["reports"], runs[f"ddp{procs}"]["reports"]
    assert sorted(fsdp) == list(range(procs)) and fsdp[0]["param_type"] == "DTensor"
    assert ddp[0]["param_type"] == "Parameter"
    for rank in range(procs):
        assert fsdp[rank]["weights"].keys() == ddp[0]["weights"].keys()
        for key, value in ddp[0]["weights"].items():
            assert fsdp[rank]["weights"][key] == pytest.approx(value, abs=1e-5), key
    a, b = final(runs[f"fsdp{procs}"]), final(runs[f"ddp{procs}"])
    for key, tensor in b["models"]["model"].items():
        torch.testing.assert_close(a["models"]["model"][key], tensor, atol=1e-5, rtol=0)
    assert a["meta"]["sharded"] is True and os.path.islink(os.path.join(runs[f"fsdp{procs}"]["logdir"],
                                                                         "checkpoints", "last.pth"))


def test_validation_metrics_equal_one_process(runs):
    one = runs["fsdp1"]["reports"][0]["history"][0]["metrics"]["valid"]["loss"]  # epoch 1 validates first
    for name in ("fsdp2", "fsdp4"):
        for report in runs[name]["reports"].values():
            assert report["history"][0]["metrics"]["valid"]["loss"] == pytest.approx(one, abs=1e-6)


def test_the_optimizer_given_to_train_steps_the_sharded_parameters(runs):
    for report in runs["fsdp2"]["reports"].values():
        assert report["same_optimizer"] and report["bound"] and report["param_type"] == "DTensor"
        # two groups keep their own learning rates through StepLR(gamma=0.5), epoch after epoch
        assert [entry["lrs"] for entry in report["history"]] == [[0.01, 0.0025], [0.005, 0.00125],
                                                                [0.0025, 0.000625]]
    start = {k: v.double().sum().item() for k, v in _initial_weights().items()}
    assert all(abs(runs["fsdp2"]["reports"][0]["weights"][k] - v) > 1e-4 for k, v in start.items())
    optimizer = final(runs["fsdp2"])["optimizers"]["optimizer"]
    assert set(optimizer["state"]) == set(start)  # state keyed by parameter name: loadable on any world size
    assert [g["lr"] for g in optimizer["param_groups"]] == [0.0025, 0.000625]


def _initial_weights():
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    return model.state_dict()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kill", [{"KILL_AT_BATCH": 7, "KILL_RANK": 1}, {"KILL_IN_SAVE": 4},
                                  {"KILL_IN_FSYNC": 4, "KILL_RANK": 1}],
                         ids=["mid-epoch", "mid-checkpoint-switch", "mid-shard-write"])
def test_killed_fsdp_run_resumes_bitwise_equal(runs, tmp_path, kill):
    logdir = tmp_path / "run"
    killed = launch(logdir, STRATEGY="fsdp-units", **COMMON, **kill)
    assert killed["code"] != 0
    survivor = load_checkpoint(os.path.join(logdir, "checkpoints", "last.pth"))  # complete, whatever the moment
    assert not survivor["loop"]["epoch_done"] and survivor["loop"]["global_batch_step"] == 6
    resumed = launch(logdir, "last", STRATEGY="fsdp-units", **COMMON)
    assert resumed["code"] == 0, resumed["out"][-3000:]
    a, b = final(runs["fsdp2"]), final(resumed)
    assert [d for key in EXACT_KEYS if key != "callbacks" for d in differences(a[key], b[key], key)] == []
    assert a["callbacks"]["checkpoint"]["best"] == b["callbacks"]["checkpoint"]["best"]
    names = sorted(os.listdir(os.path.join(logdir, "checkpoints")))
    data = [n for n in names if n.startswith(".sharded-")]
    assert len(data) <= 3 and not [n for n in names if n.endswith(".link")]  # no orphans, no half-made links


@pytest.mark.timeout(900)
@pytest.mark.parametrize("procs", [1, 4])
def test_resume_on_another_world_size_loads_the_resharded_state_and_trains_on(runs, tmp_path, procs):
    source = os.path.join(runs["fsdp2"]["logdir"], "checkpoints", "last.pth")
    run = launch(tmp_path / "run", source, STRATEGY="fsdp-units", NPROC=procs, EPOCHS=4, **COMMON)
    assert run["code"] == 0, run["out"][-3000:]
    assert "written by 2 process(es), resumed by %d" % procs in run["out"]
    reports = run["reports"]
    assert sorted(reports) == list(range(procs)) and reports[0]["world_size"] == procs
    history = reports[0]["history"]
    assert [entry["epoch"] for entry in history] == [4]  # epochs 1-3 came from the checkpoint
    assert history[0]["lrs"] == [0.00125, 0.0003125]  # the scheduler went on from its state
    before = runs["fsdp2"]["reports"][0]["history"]
    assert history[0]["metrics"]["train"]["loss"] < before[0]["metrics"]["train"]["loss"]
    assert all(report["weights"] == reports[0]["weights"] for report in reports.values())
    assert reports[0]["weights"] != runs["fsdp2"]["reports"][0]["weights"]


def test_consolidate_writes_one_file_a_plain_model_loads(runs, tmp_path):
    from torchstage.cli import main
    out = tmp_path / "model.pth"
    assert main(["checkpoint", "consolidate", os.path.join(runs["fsdp2"]["logdir"], "checkpoints", "best.pth"),
                 str(out)]) == 0
    checkpoint = torch.load(out, weights_only=True)
    model = torch.nn.Sequential(*_layers())
    model.load_state_dict(checkpoint["models"]["model"])
    assert checkpoint["meta"]["world_size"] == 2 and checkpoint["meta"]["sharded"] is False
    assert main(["checkpoint", "consolidate", str(out), str(tmp_path / "again.pth")]) == 2


def _layers():
    nn = torch.nn
    return [nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)]


def test_inspect_reads_a_sharded_checkpoint(runs, capsys):
    from torchstage.cli import main
    assert main(["checkpoint", "inspect", os.path.join(runs["fsdp2"]["logdir"], "checkpoints", "last.pth")]) == 0
    text = capsys.readouterr().out
    assert "world size 2 (sharded" in text and "model       model: 6 tensors, 401 values" in text
    assert "position    stage 'main', epoch 3 (end of epoch)" in text


def test_an_optimizer_holding_a_parameter_outside_the_model_fails_before_training():
    from torchstage import SupervisedRunner
    model, stray = torch.nn.Linear(2, 2), torch.nn.Parameter(torch.zeros(3, 5))
    loader = [(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))]
    with pytest.raises(ValueError, match=r"holds a parameter of shape \(3, 5\) in param_groups\[1\] that is in no "
                                         r"model given to train\(\)"):
        SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(),
                                 optimizer=torch.optim.SGD([{"params": model.parameters()}, {"params": [stray]}], lr=0.1),
                                 loaders={"train": loader, "valid": loader}, strategy="fsdp")


def test_compile_is_refused_with_fsdp_before_training():
    from torchstage import SupervisedRunner
    model = torch.nn.Linear(2, 2)
    loader = [(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long))]
    with pytest.raises(ValueError, match="compile=True is not supported with strategy='fsdp'"):
        SupervisedRunner().train(model=model, criterion=torch.nn.CrossEntropyLoss(), compile=True,
                                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 loaders={"train": loader, "valid": loader}, strategy="fsdp")


def test_wrapping_policy_takes_big_children_looks_into_containers_or_takes_named_classes():
    from torchstage import FSDP
    nn = torch.nn
    block = lambda: nn.Sequential(nn.Linear(10, 10), nn.ReLU())  # noqa: E731  110 parameters
    model = nn.Sequential(nn.Linear(10, 2), nn.ModuleList([block(), block()]), block())
    layers = model[1]
    assert FSDP(min_params=100).units(model) == [layers[0], layers[1], model[2]]
    assert FSDP(min_params=200).units(model) == []  # the ModuleList holds 220, but each block 110
    assert FSDP(modules=nn.ReLU).units(model) == [model[2][1], layers[1][1], layers[0][1]]
    with pytest.raises(ValueError, match="min_params=...\\) must be an integer >= 1"):
        FSDP(min_params=0)


def test_the_documented_example_trains_sharded_and_consolidates(tmp_path):
    result = run_script(["scripts/fsdp_example.py", tmp_path / "logs"], nproc=2, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "starting 2 processes (gloo" in out
    for rank in (0, 1):  # each rank holds half of every sharded block
        assert f"[rank{rank}]: rank {rank}/2 holds" in out
    assert "of 4,2" in out  # 4.2M parameters in all, about half of them per rank
    assert os.path.isdir(tmp_path / "logs" / "checkpoints" / "last.pth")


def test_bf16_mixed_precision_trains_with_float32_master_weights(tmp_path):
    run = launch(tmp_path / "run", STRATEGY="fsdp-units", AMP="bf16", EPOCHS=1, ACC=2)
    assert run["code"] == 0, run["out"][-3000:]
    loss = run["reports"][0]["history"][0]["metrics"]["train"]["loss"]
    assert 0 < loss < 10
    weights = final(run)["models"]["model"]
    assert {t.dtype for t in weights.values()} == {torch.float32}  # sharded parameters stay float32
