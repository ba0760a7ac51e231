"""Mixed precision for ``train(amp=...)``: the autocast dtype, checked against the device, and a grad scaler.

``amp="bf16"`` autocasts forward and loss to bfloat16 (CUDA and CPU); ``amp="fp16"`` autocasts to float16
and scales the loss with a :class:`torch.amp.GradScaler` (CUDA only); ``amp="auto"`` (what Catalyst's
``fp16=True`` maps to) picks fp16 on CUDA and bf16 elsewhere, and logs the choice. Backward and the optimizer
step run outside autocast, as torch recommends.
"""
import logging

import torch

logger = logging.getLogger("torchstage")
AUTO = "auto"

_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def amp_dtype(value):
    """The autocast dtype asked for by ``amp`` (``None``/``False`` for full precision); ValueError otherwise."""
    if value is None or value is False:
        return None
    if value in (torch.bfloat16, torch.float16):
        return value
    if isinstance(value, str) and value.lower() in _NAMES:
        return _NAMES[value.lower()]
    if isinstance(value, str) and value.lower() == AUTO:
        return AUTO
    raise ValueError(f"amp must be None, 'bf16' or 'fp16' (or torch.bfloat16 / torch.float16), or 'auto' "
                     f"(fp16 on CUDA, bf16 elsewhere), got {value!r}")


def setup_amp(runner, amp) -> None:
    """Set ``runner.amp_dtype`` and ``runner.scaler`` for the engine's device; refuse what the device can't do."""
    dtype, device = amp_dtype(amp), runner.engine.device
    if dtype == AUTO:
        dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        if runner.engine.is_main:
            logger.info("amp=%r: autocast to %s on %s%s", amp, str(dtype).replace("torch.", ""), device,
                        " with a grad scaler" if dtype is torch.float16 else " (float16 needs CUDA)")
    runner.amp_dtype, runner.scaler = dtype, None
    if dtype is None:
        return
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"amp={amp!r} is supported on CUDA and CPU devices, not on {device.type!r}")
    if dtype is torch.float16 and device.type != "cuda":
        raise ValueError(f"amp={amp!r} (float16 with a grad scaler) needs a CUDA device, but this run is on "
                         f"{device}; use amp='bf16' on CPU")
    if dtype is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"amp={amp!r}: this GPU does not support bfloat16; use amp='fp16'")
    if dtype is torch.float16:
        runner.scaler = torch.amp.GradScaler("cuda")
