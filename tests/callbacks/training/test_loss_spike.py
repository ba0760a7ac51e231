"""The loss-spike rule: above the running median by a factor or by robust deviations, judged lazily, kept per rank."""
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, CallbackOrder, LossSpike, LossSpikeError, NonFiniteLossCallback, SupervisedRunner


def test_the_factor_rule_compares_with_the_median_of_the_accepted_losses():
    rule = LossSpike(factor=10, window=5, warmup=3)
    history = rule.history()
    assert [rule.judge(history, v) for v in (1.0, 2.0, 3.0)] == [None] * 3  # warm-up: kept, not judged
    assert rule.judge(history, 19.9) is None  # median 2: not above 20
    why = rule.judge(history, 30.0)  # median of 1, 2, 3, 19.9: 2.5
    assert why == "above 10 x its running median 2.5 over the last 4 train losses"
    assert list(history) == [1.0, 2.0, 3.0, 19.9]  # a spike is not kept
    for value in (2.0, 2.0, 2.0):
        rule.judge(history, value)
    assert list(history) == [3.0, 19.9, 2.0, 2.0, 2.0]  # the last `window` accepted


def test_a_negative_median_is_exceeded_by_factor_minus_one_times_its_size():
    rule = LossSpike(factor=3, window=3, warmup=3)
    history = rule.history([-2.0, -2.0, -2.0])
    assert rule.judge(history, 1.9) is None and rule.judge(history, 2.1) is not None  # -2 + 2 x 2 = 2


def test_the_deviation_rule_counts_robust_deviations_with_a_floor():
    rule = LossSpike(deviations=5, window=6, warmup=6)
    assert rule.factor is None
    losses = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8]  # median 1.0, MAD 0.1: unit 0.148
    assert rule.judge(rule.history(losses), 1.7) is None
    assert rule.judge(rule.history(losses), 1.8).startswith("5.4 robust deviations above its running median 1 "
                                                            "(deviation unit 0.148)")
    steady = rule.history([2.0] * 6)  # MAD 0: the unit is 1 % of the median
    assert rule.judge(steady, 2.09) is None and rule.judge(steady, 2.11) is not None


def test_both_rules_flag_either_way_and_the_arguments_are_checked():
    rule = LossSpike(factor=100, deviations=3, window=4, warmup=4)
    assert rule.judge(rule.history([1.0, 1.0, 1.2, 0.8]), 2.0).startswith("6.7 robust deviations")
    assert repr(rule) == "LossSpike(factor=100, deviations=3, window=4, warmup=4)"
    assert LossSpike().factor == 10.0 and LossSpike().warmup == 20 and LossSpike(window=5).warmup == 5
    for kwargs, message in (({"factor": 1}, "factor must be a number > 1, got 1"),
                            ({"deviations": -1}, "deviations must be a number > 0"),
                            ({"factor": math.inf}, "factor must be a number > 1, got inf"),
                            ({"window": 2}, "window must be an integer >= 3"),
                            ({"window": 10, "warmup": 11}, "warmup must be an integer from 1 to window=10")):
        with pytest.raises(ValueError, match=message):
            LossSpike(**kwargs)


class Spike(Callback):
    """Multiplies the loss of the given global train batches by 1e4 (after the criterion, before the watcher)."""

    order = CallbackOrder.Metric + 1

    def __init__(self, at):
        self.at = set(at)

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step in self.at:
            runner.batch_metrics["loss"] = runner.batch_metrics["loss"] * 1e4


def _run(nonfinite, spikes=(), epochs=1):
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    model = nn.Linear(4, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    return SupervisedRunner().train(model=model, criterion=nn.MSELoss(), num_epochs=epochs,
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.01), loaders={"train": loader},
                                    valid_loader="train", callbacks={"nonfinite": nonfinite, "spike": Spike(spikes)})


def test_mode_stop_stops_at_the_first_spike_read_at_the_next_check():
    rule = LossSpike(factor=10, window=6, warmup=4)
    with pytest.raises(LossSpikeError, match=r"loss spike: 'loss' was \S+ \(above 10 x its running median \S+ over "
                                             r"the last 6 train losses\) at stage 'main', epoch 1, loader 'train', "
                                             r"batch 9 \(global batch 9\)"):
        _run(NonFiniteLossCallback(check_every=4, spike=rule), spikes=[9, 10])
    runner = _run(NonFiniteLossCallback(check_every=4, spike=rule))  # no spike: no error, the windows kept
    assert len(runner.callbacks["nonfinite"].state_dict()["spike_windows"]["loss"]) == 6


def test_mode_skip_skips_a_spiking_batch_without_keeping_it_in_the_window():
    runner = _run(NonFiniteLossCallback(mode="skip", spike=LossSpike(factor=10, window=6, warmup=4)), spikes=[7])
    assert runner.epoch_metrics["train"]["nonfinite_skipped"] == 1.0
    assert all(value < 50 for value in runner.callbacks["nonfinite"].state_dict()["spike_windows"]["loss"])


def test_the_windows_go_into_checkpoints_per_rank_and_come_back(tmp_path):
    callback = NonFiniteLossCallback(spike=LossSpike(window=5, warmup=3))
    assert callback.state_per_rank and not NonFiniteLossCallback().state_per_rank
    callback.load_state_dict({"spike_windows": {"loss": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}})
    assert callback.state_dict() == {"spike_windows": {"loss": [2.0, 3.0, 4.0, 5.0, 6.0]}}
    assert callback.merge_rank_states([{"spike_windows": {"loss": [1.0]}}, {}]) == {"spike_windows": {"loss": [1.0]}}


def test_the_window_keeps_the_last_values_in_order_and_their_median():
    import random
    import statistics
    rng, window, values = random.Random(0), LossSpike(window=7).history(), []
    for _ in range(60):
        value = rng.choice([rng.random(), 1.0, 0.5])  # repeated values too
        window.append(value)
        values.append(value)
        assert list(window) == values[-7:] and window.median() == statistics.median(values[-7:])
