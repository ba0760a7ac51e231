"""The criterion of a causal language model: logits ``[batch, tokens, vocabulary]`` against targets ``[batch, tokens]``
(torch's CrossEntropyLoss takes the classes in dimension 1, so it refuses, or with tokens == vocabulary silently
misreads, this layout)."""
import torch
import torch.nn.functional as F


class CausalLMLoss(torch.nn.Module):
    """``criterion=CausalLMLoss()``: the mean cross entropy over the tokens counted (``ignore_index`` masks padding).

    ``logits`` may be a model output holding them (a Hugging Face ``CausalLMOutput``: its ``.logits``). Targets are
    each position's next token; with ``shift=True`` they are the inputs themselves (Hugging Face's ``labels``), and
    position t is scored on token t + 1. The logits are upcast to float32 for the softmax.
    """

    def __init__(self, ignore_index: int = -100, shift: bool = False, label_smoothing: float = 0.0):
        super().__init__()
        self.ignore_index, self.shift, self.label_smoothing = ignore_index, shift, label_smoothing

    def forward(self, logits, targets: torch.Tensor) -> torch.Tensor:
        logits = getattr(logits, "logits", logits)
        if logits.dim() != 3 or tuple(targets.shape) != tuple(logits.shape[:2]):
            raise ValueError(f"CausalLMLoss compares logits [batch, tokens, vocabulary] with targets [batch, tokens], "
                             f"got logits of shape {list(logits.shape)} and targets of shape {list(targets.shape)}")
        if self.shift:
            logits, targets = logits[:, :-1], targets[:, 1:]
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=self.ignore_index,
                               label_smoothing=self.label_smoothing)
