"""strategy="deepspeed" on 2 and 4 gloo processes (real DeepSpeed, CPU): ZeRO 1, 2 and 3 give DDP's weights with
the user's AdamW (two groups) and StepLR, exit cleanly, write checkpoints in torchstage's layout that resume bitwise
after kill -9, reshard on another world size, and consolidate into a plain state dict."""
import glob
import importlib.util
import os

import pytest
import torch

from tests.strategies.test_fsdp import COMMON, Runs, _layers, final, launch
from tests.resume_helpers import EXACT_KEYS, differences
from torchstage.cli import main
from torchstage.files.deepspeed_files import safe_load

# the deepspeed extra (installed by .ci/run); looked up, not imported, at collection (1.2 s of CPU in every test process)
pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs the deepspeed extra")]


#: Two epochs of the FSDP tests' run (10 train batches each), mid-epoch checkpoints, clipping and accumulation.
RUNS = {**{f"zero{stage}": {"STRATEGY": f"deepspeed{stage}", "EPOCHS": 2, **COMMON} for stage in (1, 2, 3)},
        "ddp": {"STRATEGY": "ddp", "EPOCHS": 2, **COMMON}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("deepspeed"), RUNS)


def _clean_exit(run):
    assert run["code"] == 0, run["out"][-3000:]
    assert "terminate called" not in run["out"] and "Traceback" not in run["out"]


def _deepspeed_files(run) -> dict:
    """Every tensor and value of DeepSpeed's files in the run's last checkpoint, by file name (read safely)."""
    folder = os.path.join(run["logdir"], "checkpoints", "last.pth", "model")
    files = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.pt"))):
        state = safe_load(path)
        state.pop("ds_config", None)
        files[os.path.basename(path)] = _plain(state)
    return files


def _plain(node):
    """DeepSpeed's objects (its loss scaler) as their attributes, which compare by value."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(v) for v in node]
    return vars(node) if type(node).__module__.startswith("deepspeed.") and hasattr(node, "__dict__") else node


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3"])
def test_zero_stages_train_ddp_weights_and_exit_cleanly(runs, name):
    """On 2 processes; the 4-process case is the resharded resume below (ZeRO 2 and 3 against DDP on 4)."""
    run = runs[name]
    _clean_exit(run)
    a, b = final(run), final(runs["ddp"])
    assert a["models"]["model"].keys() == b["models"]["model"].keys()
    for key, tensor in b["models"]["model"].items():
        torch.testing.assert_close(a["models"]["model"][key], tensor, atol=1e-4, rtol=0)
    # the user's AdamW: both groups stepped by StepLR(gamma=0.5), epoch after epoch, on every rank
    lrs = [[0.01, 0.0025], [0.005, 0.00125]]
    assert sorted(run["reports"]) == [0, 1]
    assert all(r["same_optimizer"] and [e["lrs"] for e in r["history"]] == lrs for r in run["reports"].values())
    assert a["metrics"]["valid"]["loss"] == pytest.approx(b["metrics"]["valid"]["loss"], abs=1e-5)
    assert os.path.islink(os.path.join(run["logdir"], "checkpoints", "last.pth"))
    assert a["optimizers"]["optimizer"]["deepspeed"]["stage"] == int(RUNS[name]["STRATEGY"][-1])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage,kill", [(1, {"KILL_AT_BATCH": 7, "KILL_RANK": 1}), (2, {"KILL_IN_FSYNC": 3,
                                                                                        "KILL_RANK": 1}),
                                        (3, {"KILL_IN_SAVE": 4})],
                         ids=["zero1-mid-epoch", "zero2-mid-shard-write", "zero3-mid-checkpoint-switch"])
def test_killed_run_resumes_bitwise_equal(runs, tmp_path, stage, kill):
    logdir, settings = tmp_path / "run", RUNS[f"zero{stage}"]
    killed = launch(logdir, **settings, **kill)
    assert killed["code"] != 0
    survivor = final(killed)  # complete, whatever the moment of the kill
    assert not survivor["loop"]["epoch_done"] and survivor["loop"]["global_batch_step"] in (4, 6)
    resumed = launch(logdir, "last", **settings)
    _clean_exit(resumed)
    assert "resuming from" in resumed["out"]
    a, b = final(runs[f"zero{stage}"]), final(resumed)
    assert [d for key in EXACT_KEYS if key != "callbacks" for d in differences(a[key], b[key], key)
            if not d.startswith("optimizers/optimizer/deepspeed/path")] == []
    assert a["callbacks"]["checkpoint"]["best"] == b["callbacks"]["checkpoint"]["best"]
    # DeepSpeed's own state (fp32 partitions, Adam moments, step counters) bitwise too; but ZeRO-3 pads each
    # parameter's partition to a multiple of the world size with uninitialized memory that no weight reads: its
    # fp32 partitions are compared through the consolidated weights above, which they hold without the padding
    padding = "/optimizer_state_dict/fp32_flat_groups[" if stage == 3 else None
    assert [d for d in differences(_deepspeed_files(runs[f"zero{stage}"]), _deepspeed_files(resumed))
            if padding is None or padding not in d] == []
    names = sorted(os.listdir(logdir / "checkpoints"))
    assert len([n for n in names if n.startswith(".sharded-")]) <= 3 and not [n for n in names if n.endswith(".link")]


@pytest.mark.timeout(900)
def test_resume_on_another_world_size_reshards_as_ddp_reloads(runs, tmp_path):
    """ZeRO-2 and ZeRO-3 state of 2 processes resharded over 4: the next epoch trains as DDP's from its own
    checkpoint of the same run does (Adam's moments restored, else the first steps would differ by ~lr), and all
    4 processes exit cleanly."""
    resumed = {}
    for name in ("ddp", "zero2", "zero3"):
        checkpoint = os.path.join(runs[name]["logdir"], "checkpoints", "last.pth")
        run = launch(tmp_path / name, checkpoint, **{**RUNS[name], "NPROC": 4, "EPOCHS": 3})
        _clean_exit(run)
        assert "written by 2 process(es), resumed by 4" in run["out"]
        resumed[name] = final(run)
    for name in ("zero2", "zero3"):
        a, b = resumed[name], resumed["ddp"]
        assert a["loop"]["global_epoch_step"] == 3 and a["meta"]["world_size"] == 4
        for key, tensor in b["models"]["model"].items():
            torch.testing.assert_close(a["models"]["model"][key], tensor, atol=1e-5, rtol=0)
        assert [g["lr"] for g in a["optimizers"]["optimizer"]["param_groups"]] == [0.0025, 0.000625]


@pytest.mark.timeout(900)
def test_a_zero_checkpoint_continues_under_ddp_and_on_one_process(runs, tmp_path):
    """Following the refusal's advice (strategy='ddp') failed with torch's raw "loaded state dict contains a parameter
    group that doesn't match": the ZeRO partitions of the weights and of Adam's moments are now consolidated into
    torch's own state, so the next epoch trains as DDP's from its own checkpoint of the same run does."""
    resumed = {}
    for source, procs in (("ddp", 2), ("zero2", 2), ("ddp", 1), ("zero3", 1)):
        checkpoint = os.path.join(runs[source]["logdir"], "checkpoints", "last.pth")
        run = launch(tmp_path / f"{source}-{procs}", checkpoint, **{**RUNS["ddp"], "NPROC": procs, "EPOCHS": 3})
        _clean_exit(run)
        resumed[source, procs] = final(run)
    for zero, procs in (("zero2", 2), ("zero3", 1)):  # DDP's own checkpoint continued the same way
        a, b = resumed[zero, procs], resumed["ddp", procs]
        assert a["loop"]["global_epoch_step"] == 3 and "deepspeed" not in a["optimizers"]["optimizer"]
        for key, tensor in b["models"]["model"].items():
            torch.testing.assert_close(a["models"]["model"][key], tensor, atol=1e-5, rtol=0)
        assert [g["lr"] for g in a["optimizers"]["optimizer"]["param_groups"]] == [0.0025, 0.000625]


def test_another_zero_stage_is_refused_with_the_reason(runs):
    from torchstage import CheckpointError, DeepSpeed
    from torchstage.files.checkpoint_read import load_checkpoint
    state = load_checkpoint(os.path.join(runs["zero3"]["logdir"], "checkpoints", "last.pth"))["optimizers"]["optimizer"]
    strategy = DeepSpeed(stage=2)
    strategy._world_size = 2  # what setup() takes from a world of 2
    with pytest.raises(CheckpointError, match="was written at ZeRO stage 3 and is resumed at stage 2; resume it at "
                                              "stage 3"):
        strategy.load_optimizer_state_dict(torch.optim.AdamW(torch.nn.Linear(2, 1).parameters()), {}, state)


@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_consolidate_writes_a_plain_state_dict_a_model_loads(runs, tmp_path, capsys, name):
    best = os.path.join(runs[name]["logdir"], "checkpoints", "best.pth")
    assert main(["checkpoint", "inspect", best]) == 0
    text = capsys.readouterr().out
    assert "model       model: 6 tensors, 401 values" in text and "world size 2" in text
    out = tmp_path / "model.pth"
    assert main(["checkpoint", "consolidate", best, str(out)]) == 0
    checkpoint = torch.load(out, weights_only=True)
    model = torch.nn.Sequential(*_layers())
    model.load_state_dict(checkpoint["models"]["model"])
    assert all(t.dtype == torch.float32 and not t.requires_grad for t in checkpoint["models"]["model"].values())


class _Payload:
    """An object whose unpickling runs a shell command."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_malicious_pickle_inside_a_deepspeed_checkpoint_is_refused(runs, tmp_path, capsys):
    import shutil
    from torchstage import CheckpointError, load_checkpoint
    from torchstage.strategies.deepspeed_state import safe_checkpoint_engine
    checkpoint = tmp_path / "evil"
    shutil.copytree(os.path.join(runs["zero2"]["logdir"], "checkpoints", "last.pth"), checkpoint)
    target = checkpoint / "model" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    marker = tmp_path / "code-ran"
    torch.save({"optimizer_state_dict": _Payload(f"touch {tmp_path / 'proof'}")}, tmp_path / "proof.pt")
    torch.load(tmp_path / "proof.pt", weights_only=False)  # the payload is real: plain unpickling runs it
    assert (tmp_path / "proof").exists()
    torch.save({"optimizer_state_dict": _Payload(f"touch {marker}")}, target)
    with pytest.raises(CheckpointError, match="refused to load .*zero_pp_rank_0_mp_rank_00_optim_states.pt.* "
                                              "weights_only=True"):
        load_checkpoint(str(checkpoint))
    with pytest.raises(CheckpointError, match="refused to load"):  # what a resuming engine reads its files with
        safe_checkpoint_engine(None).load(str(target))
    assert main(["checkpoint", "inspect", str(checkpoint)]) == 2
    assert main(["checkpoint", "consolidate", str(checkpoint), str(tmp_path / "out.pth")]) == 2
    assert "refused to load" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "out.pth").exists()
