"""A small GPT-style language model trained with pipeline parallelism: its blocks cut into stages, run by torch's
pipeline schedules, alone or with data or tensor parallelism; one argument changes.

    python scripts/pipeline_example.py [LOGDIR] [pp|pp-looped|pp-tp]     # one process per GPU
    TORCHSTAGE_NPROC=4 python scripts/pipeline_example.py logs pp        # on CPU: 4 processes, gloo
    torchrun --nproc-per-node=4 scripts/pipeline_example.py logs pp-tp

``pp``: 2 stages x 2 data-parallel ranks (1F1B, 4 microbatches); ``pp-looped``: the same ranks with 2 stages each
(Interleaved1F1B, a smaller bubble); ``pp-tp``: 2 stages x tensor parallel 2 (each block's layers split over 2 ranks).
The model is written as its pieces in order (embedding, blocks, norm, head), which is what a pipeline cuts; the
checkpoints keep its own parameter names, so they load at any pipeline depth or none. The model learns to continue
a sequence that counts up (each token the previous one plus one).
"""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import Callback, ModelParallel, Pipeline, SupervisedRunner

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from parallelism_example import DIM, LENGTH, VOCAB, Block, tensor_parallel  # noqa: E402 (the same block and plan)


class Embedding(nn.Module):
    """Tokens and positions: the first piece (the first stage's input is the token ids)."""

    def __init__(self):
        super().__init__()
        self.tokens, self.position = nn.Embedding(VOCAB, DIM), nn.Parameter(torch.zeros(LENGTH, DIM))

    def forward(self, tokens):
        return self.tokens(tokens) + self.position


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return self.proj(x).transpose(1, 2)  # (batch, vocab, length), as CrossEntropyLoss takes it


class LanguageModel(nn.Module):
    """Its 9 pieces in order: a pipeline of 2 stages takes the embedding and blocks 0-3, then blocks 4-5, norm, head
    (``Pipeline(2, split=["blocks.3"])`` would cut before block 3 instead)."""

    def __init__(self, depth=6):
        super().__init__()
        self.embed = Embedding()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(DIM), Head()

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Describe(Callback):
    """Says, on each rank at the end, which pieces of the model it trained and the valid loss it holds."""

    order = 500

    def on_experiment_end(self, runner):
        engine = runner.engine
        held = {".".join(name.split(".")[:2]) if name.startswith("blocks.") else name.split(".")[0]
                for name, _ in runner.model.named_parameters()}
        order = [name for name, _ in LanguageModel().named_children()]
        held = sorted(held, key=lambda n: (order.index(n.split(".")[0]), n))
        print(f"rank {engine.rank}/{engine.world_size} (pipeline stage {engine.coordinates['pipeline']}, "
              f"data-parallel {engine.dp_rank}/{engine.dp_size}) holds {', '.join(held)}; valid loss "
              f"{runner.epoch_metrics['valid']['loss']:.3f}")


STRATEGIES = {"pp": lambda: Pipeline(2, schedule="1F1B", n_microbatches=4, modules=Block),
              "pp-looped": lambda: Pipeline(2, schedule="Interleaved1F1B", n_microbatches=4, modules=Block),
              "pp-tp": lambda: ModelParallel(tensor=2, parallelize=tensor_parallel, pipeline=2, n_microbatches=4)}

if __name__ == "__main__":
    logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs/pipeline_example"
    strategy = STRATEGIES[sys.argv[2] if len(sys.argv) > 2 else "pp"]()
    torch.manual_seed(0)  # every process builds the same data and the same initial model
    starts = torch.randint(0, VOCAB, (640, 1))
    sequences = (starts + torch.arange(LENGTH + 1)) % VOCAB
    data = TensorDataset(sequences[:, :-1], sequences[:, 1:])  # predict the next token
    loaders = {"train": DataLoader(torch.utils.data.Subset(data, range(512)), batch_size=16, shuffle=True),
               "valid": DataLoader(torch.utils.data.Subset(data, range(512, 640)), batch_size=16)}
    model = LanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3)
    runner = SupervisedRunner()
    runner.train(model=model, criterion=nn.CrossEntropyLoss(), optimizer=optimizer, scheduler=scheduler,
                 loaders=loaders, logdir=logdir, num_epochs=3, distributed=True, strategy=strategy,
                 grad_clip_norm=1.0, callbacks=[Describe()])
