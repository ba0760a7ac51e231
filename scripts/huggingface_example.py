"""Fine-tune a Hugging Face causal language model under FSDP or tensor parallel + FSDP, from its pretrained folder.

    python scripts/huggingface_example.py save-tiny PRETRAINED            # a tiny Llama, as save_pretrained writes it
    TORCHSTAGE_NPROC=4 python scripts/huggingface_example.py train LOGDIR PRETRAINED fsdp [EPOCHS]  # or tp (2 x 2)
    torchstage checkpoint export LOGDIR/checkpoints/last.pth OUT --format safetensors --config PRETRAINED

``save-tiny`` stands for a download: a 4-layer Llama built from a config (no network), saved in several
safetensors shards with their index. ``train`` builds the model from the folder's config on the meta device (no rank
ever holds it whole), shards it (``fsdp``: each decoder layer with FSDP2; ``tp``: the model's own tensor-parallel
plan, ``base_model_tp_plan``, over 2 ranks, then FSDP2 over the others), reads each rank's part of the pretrained
weights (``init_from``), checkpoints each decoder layer's activations, and teaches the model to count on from any
number. Rank 0 prints each data-parallel rank's first-batch loss and the trained model's continuation of a prompt.
"""
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchstage import FSDP, CausalLMLoss, Callback, ModelParallel, SupervisedRunner

VOCAB, LENGTH = 64, 16


def save_tiny(folder: str) -> None:
    """A small pretrained Llama in ``folder`` (config.json, model-0000x-of-0000y.safetensors and their index)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=LENGTH, use_cache=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="100KB")


def counting_data(n: int, seed: int = 0):
    """Sequences that count up modulo the vocabulary from a random start: each target is its input's next token."""
    starts = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
    sequences = (starts + torch.arange(LENGTH + 1)) % VOCAB
    return TensorDataset(sequences[:, :-1], sequences[:, 1:])


class FirstLoss(Callback):
    """Prints the first train batch's loss of each data-parallel rank (every rank of a tensor-parallel group has the
    same batch)."""

    order = 30  # after the criterion

    def on_batch_end(self, runner):
        if runner.is_train_loader and runner.global_batch_step == 1:
            losses = runner.engine.all_gather_object(float(runner.batch_metrics["loss"].detach()))
            if runner.engine.is_main:
                tensor = runner.engine.tp_size
                print("first batch loss by data-parallel rank:", [losses[r] for r in range(0, len(losses), tensor)])


class Continuation(Callback):
    """After training, while the world is still up (the model is sharded: every rank runs it), the trained model's
    greedy continuation of ``5 6 7 8``."""

    order = 500

    def on_experiment_end(self, runner):
        tokens = torch.tensor([[5, 6, 7, 8]])
        runner.model.eval()
        with torch.no_grad():
            for _ in range(6):
                tokens = torch.cat([tokens, runner.model(tokens).logits[:, -1:].argmax(-1)], dim=1)
        if runner.engine.is_main:
            print(f"valid loss {runner.epoch_metrics['valid']['loss']:.4f}; 5 6 7 8 continues as {tokens[0, 4:].tolist()}")


def train(logdir: str, pretrained: str, layout: str, epochs: int = 2) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    config = AutoConfig.from_pretrained(pretrained)
    with torch.device("meta"):  # shapes only: each rank materialises its own shards
        model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    strategy = {"fsdp": FSDP(modules=LlamaDecoderLayer),
                "tp": ModelParallel(tensor=2, modules=LlamaDecoderLayer)}[layout]  # the model's own plan
    loaders = {"train": DataLoader(counting_data(256), batch_size=8),
               "valid": DataLoader(counting_data(64, seed=1), batch_size=8)}
    runner = SupervisedRunner()
    runner.train(model=model, criterion=CausalLMLoss(), optimizer=optimizer, loaders=loaders, logdir=logdir,
                 num_epochs=epochs, distributed=True, strategy=strategy, callbacks=[FirstLoss(), Continuation()],
                 init_from=pretrained, init_weights=model._init_weights,  # buffers no checkpoint holds (rotary)
                 activation_checkpointing=LlamaDecoderLayer, grad_clip_norm=1.0, overwrite=True)


if __name__ == "__main__":
    if sys.argv[1] == "save-tiny":
        save_tiny(sys.argv[2])
    else:
        train(sys.argv[2], sys.argv[3], *sys.argv[4:5], *map(int, sys.argv[5:6]))
