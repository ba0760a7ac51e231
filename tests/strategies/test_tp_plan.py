"""Tensor-parallel plans checked before they are applied (every entry names a module), and transformers' own plans
(base_model_tp_plan) translated into torch's ParallelStyles."""
import pytest
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from torchstage.strategies.tp_plan import check_entries, matching, model_plan, resolve_plan


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.ModuleDict({"wq": nn.Linear(4, 4), "wo": nn.Linear(4, 4)})
        self.mlp = nn.ModuleDict({"up": nn.Linear(4, 8), "down": nn.Linear(8, 4)})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))


def test_entries_match_as_parallelize_module_reads_them():
    model = Net()
    assert matching(model, "blocks.*.attention.wq") == [f"blocks.{i}.attention.wq" for i in range(3)]
    assert matching(model, "blocks.1.mlp.up") == ["blocks.1.mlp.up"]
    assert matching(model, "blocks.*.up") == [] and matching(model, "") == [""]


def test_an_entry_naming_no_module_is_refused_with_the_names_meant():
    with pytest.raises(ValueError, match=r"the tensor-parallel plan has entries that name no module of the model: "
                                         r"'blocks.\*.attention.wk' names no module; did you mean "
                                         r"'blocks.\*.attention.wq'"):
        check_entries(Net(), ["blocks.*.attention.wq", "blocks.*.attention.wk"], "X")


def test_transformers_style_names_become_torch_styles():
    plan = resolve_plan({"a": "colwise", "b": "rowwise", "c": "colwise_gather_output", "d": "embedding_rowwise",
                         "e": RowwiseParallel()}, "X")
    assert type(plan["a"]) is ColwiseParallel and type(plan["b"]) is RowwiseParallel
    assert plan["c"].output_layouts == (Replicate(),) and plan["d"].input_layouts == (Replicate(),)
    with pytest.raises(ValueError, match=r"plan\['a'\] = 'packed_colwise' is not a style torchstage can translate"):
        resolve_plan({"a": "packed_colwise"}, "X")
    with pytest.raises(TypeError, match=r"plan\['a'\] must be a torch ParallelStyle"):
        resolve_plan({"a": 3}, "X")


def test_a_transformers_model_brings_its_plan_by_full_module_name():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    plan = model_plan(model)
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise" and plan["lm_head"] == "colwise_gather_output"
    check_entries(model, plan, "X")  # every entry names modules of the model
    assert model_plan(Net()) is None


def test_a_plan_that_splits_nothing_is_refused():
    from torchstage.strategies.tp_plan import check_changed
    with pytest.raises(ValueError, match=r"X: the tensor-parallel plan split no parameter of the model .* so the run "
                                         r"would train without tensor parallelism"):
        check_changed(Net(), "X")  # what parallelize(model, mesh) returns when every entry missed
