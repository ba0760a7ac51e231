"""In-memory snapshots: taken without a collective, put back in place exactly, reusing the previous copies."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.resume_helpers import differences
from torchstage import Callback, SupervisedRunner
from torchstage.runner.snapshot import take_snapshot


class Probe(Callback):
    """At global train batch 5 takes a snapshot; at 9 checks what changed, puts it back and checks it is back."""

    order = 10_001

    def __init__(self):
        self.snapshot, self.seen = None, {}

    def state(self, runner):
        model, optimizer = runner.unwrapped_model, runner.optimizer
        return {"weights": {k: v.clone() for k, v in model.state_dict().items()},
                "moments": {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(optimizer.state.values())},
                "lr": optimizer.param_groups[0]["lr"], "scheduler": runner.scheduler.state_dict(),
                "counters": (runner.global_batch_step, runner.global_sample_step, runner.train_batches_done),
                "draw": torch.get_rng_state().clone()}

    def on_batch_end(self, runner):
        if runner.global_batch_step == 5:
            self.seen["at 5"] = self.state(runner)
            self.snapshot = runner.take_snapshot(at_start=False)
            first = self.snapshot.models["model"]["weight"]
            again = take_snapshot(runner, at_start=False, reuse=self.snapshot)
            self.seen["reused"] = again.models["model"]["weight"].data_ptr() == first.data_ptr()
        if runner.global_batch_step == 9:
            self.seen["at 9"] = self.state(runner)
            runner.restore_snapshot(self.snapshot)
            self.seen["restored"] = self.state(runner)
            self.seen["point"] = runner.resume_point
            runner.restore_snapshot(take_snapshot(runner, at_start=False))  # nothing moves a second time
            runner.resume_point = None


def test_a_snapshot_puts_the_run_back_and_sets_the_pass_to_go_on_from_it():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    probe = Probe()
    loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randn(48, 1)), batch_size=4, shuffle=True)
    runner = SupervisedRunner()
    runner.train(model=model, criterion=nn.MSELoss(), optimizer=optimizer, loaders={"train": loader},
                 scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 2), scheduler_step="batch",
                 valid_loader="train", callbacks={"probe": probe})
    at5, at9, back = probe.seen["at 5"], probe.seen["at 9"], probe.seen["restored"]
    assert probe.seen["reused"]  # a new snapshot copies into the previous one's tensors
    assert not torch.equal(at5["weights"]["weight"], at9["weights"]["weight"]) and at5["lr"] != at9["lr"]
    assert differences(at5, back) == [] and differences(at5, at9) != []
    point = probe.seen["point"]
    assert (point.loader, point.batch, point.train_batches_done, point.loader_sample_step) == ("train", 5, 5, 20)
    assert point.loader_rng is runner.loader_start_rng  # the pass replays its own order
