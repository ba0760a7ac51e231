"""A small GPT-style language model trained under DDP, FSDP, HSDP or tensor parallel + FSDP: one argument changes.

    python scripts/parallelism_example.py [LOGDIR] [ddp|fsdp|hsdp|tp]     # one process per GPU
    TORCHSTAGE_NPROC=4 python scripts/parallelism_example.py logs tp       # on CPU: 4 processes, gloo
    torchrun --nproc-per-node=4 scripts/parallelism_example.py logs hsdp
    srun -N 2 --ntasks-per-node=4 python scripts/parallelism_example.py logs hsdp

``tp`` splits every attention and MLP layer over 2 ranks (Megatron's column/row layout, with torch's
``parallelize_module``) and shards the result with FSDP2 over the other ranks; ``hsdp`` shards each block within a
node and replicates across nodes (2 replicas here; ``strategy="hsdp"`` would take the nodes the launcher gives).
The model learns to continue a sequence that counts up (each token the previous one plus one).
"""
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchstage import DDP, FSDP, ModelParallel, SupervisedRunner

VOCAB, DIM, HEADS, DEPTH, LENGTH = 64, 128, 8, 4, 16


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, n, _ = x.shape
        # the head count follows the projections' width: under tensor parallelism a rank runs its share of the heads
        q, k, v = (w(x).view(b, n, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attention, self.norm2, self.mlp = nn.LayerNorm(DIM), Attention(), nn.LayerNorm(DIM), MLP()

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.position = nn.Embedding(VOCAB, DIM), nn.Parameter(torch.zeros(LENGTH, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)).transpose(1, 2)  # (batch, vocab, length), as CrossEntropyLoss takes it


def tensor_parallel(model, tensor_mesh):
    """The tensor-parallel plan of each block: q, k, v and the MLP's first layer split by output features
    (columns), the attention output and the MLP's second layer by input features (rows), so each block needs one
    all-reduce in forward and one in backward."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, tensor_mesh, plan)
    return model


STRATEGIES = {"ddp": lambda: DDP(), "fsdp": lambda: FSDP(modules=Block),
              "hsdp": lambda: FSDP(modules=Block, replicate=2),
              "tp": lambda: ModelParallel(tensor=2, parallelize=tensor_parallel, modules=Block)}

if __name__ == "__main__":
    logdir = sys.argv[1] if len(sys.argv) > 1 else "./logs/parallelism_example"
    strategy = STRATEGIES[sys.argv[2] if len(sys.argv) > 2 else "tp"]()
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
                 grad_clip_norm=1.0)
    engine = runner.engine
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in runner.model.parameters())
    total = sum(p.numel() for p in runner.model.parameters())
    print(f"rank {engine.rank}/{engine.world_size} (data-parallel {engine.dp_rank}/{engine.dp_size}, tensor-parallel "
          f"{engine.tp_rank}/{engine.tp_size}) holds {local:,} of {total:,} parameters; valid loss "
          f"{runner.epoch_metrics['valid']['loss']:.3f}")
