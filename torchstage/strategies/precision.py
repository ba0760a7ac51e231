"""Mixed precision for ``train(amp=...)``: the autocast dtype, checked against the device, and a grad scaler.

``amp="bf16"`` autocasts forward and loss to bfloat16 (CUDA and CPU); ``amp="fp16"`` autocasts to float16
and scales the loss with a :class:`torch.amp.GradScaler` (CUDA only); ``amp="auto"`` picks fp16 on CUDA and bf16
elsewhere, and logs the choice; ``amp="fp16-or-full"`` (what Catalyst's ``fp16=True`` maps to) is fp16 on CUDA
and full precision elsewhere, as Catalyst trained, and logs it. Backward and the optimizer step run outside
autocast, as torch recommends. A strategy holds one :class:`Precision` and applies it.
"""
import contextlib
import logging

import torch

logger = logging.getLogger("torchstage")
AUTO = "auto"
#: Catalyst's ``fp16=True``: float16 on CUDA, full precision where float16 cannot run (Catalyst 20.12 and 22 alike)
FP16_OR_FULL = "fp16-or-full"

_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
_NO_AUTOCAST = contextlib.nullcontext()


def amp_dtype(value):
    """The autocast dtype asked for by ``amp`` (``None``/``False`` for full precision); ValueError otherwise."""
    if value is None or value is False:
        return None
    if value in (torch.bfloat16, torch.float16):
        return value
    if isinstance(value, str) and value.lower() in _NAMES:
        return _NAMES[value.lower()]
    if isinstance(value, str) and value.lower() in (AUTO, FP16_OR_FULL):
        return value.lower()
    raise ValueError(f"amp must be None, 'bf16' or 'fp16' (or torch.bfloat16 / torch.float16), 'auto' "
                     f"(fp16 on CUDA, bf16 elsewhere) or 'fp16-or-full' (fp16 on CUDA, full precision elsewhere), "
                     f"got {value!r}")


class Precision:
    """The autocast dtype of a run (None: full precision) and, for float16, the grad scaler of its loss."""

    def __init__(self, dtype=None, scaler=None, device_type: str = "cpu"):
        self.dtype, self.scaler, self.device_type = dtype, scaler, device_type

    @classmethod
    def for_device(cls, amp, device: torch.device, is_main: bool = True) -> "Precision":
        """The precision ``amp`` asks for on ``device``; ValueError, before training, for what it cannot do."""
        dtype = amp_dtype(amp)
        if dtype == FP16_OR_FULL:
            dtype = torch.float16 if device.type == "cuda" else None
            if is_main:
                what = (f"autocast to float16 on {device} with a grad scaler" if dtype is not None else
                        f"float16 needs CUDA; this run on {device} trains in full precision (float32), as Catalyst "
                        f"did (amp='bf16' autocasts to bfloat16 instead)")
                logger.info("fp16=True (amp=%r): %s", amp, what)
        if dtype == AUTO:
            dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
            if is_main:
                logger.info("amp=%r: autocast to %s on %s%s", amp, str(dtype).replace("torch.", ""), device,
                            " with a grad scaler" if dtype is torch.float16 else " (float16 needs CUDA)")
        if dtype is None:
            return cls(device_type=device.type)
        if device.type not in ("cuda", "cpu"):
            raise ValueError(f"amp={amp!r} is supported on CUDA and CPU devices, not on {device.type!r}")
        if dtype is torch.float16 and device.type != "cuda":
            raise ValueError(f"amp={amp!r} (float16 with a grad scaler) needs a CUDA device, but this run is on "
                             f"{device}; use amp='bf16' on CPU")
        if dtype is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(f"amp={amp!r}: this GPU does not support bfloat16; use amp='fp16'")
        return cls(dtype, torch.amp.GradScaler("cuda") if dtype is torch.float16 else None, device.type)

    def autocast(self):
        """Context for forward and loss; a shared no-op context in full precision."""
        if self.dtype is None:
            return _NO_AUTOCAST
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to backpropagate: multiplied by the scaler's scale under float16."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def unscale_(self, optimizer) -> None:
        """Gradients back to their true size before clipping (a no-op without a scaler)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        """``optimizer.step()``; under float16 skipped for non-finite gradients, and the scale updated."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict:
        """The scaler's state for a checkpoint (empty without one)."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def __repr__(self) -> str:
        dtype = "full" if self.dtype is None else str(self.dtype).replace("torch.", "")
        return f"Precision({dtype}{', grad scaler' if self.scaler is not None else ''})"


#: Full precision, the state of every strategy before a run sets its own.
FULL = Precision()
