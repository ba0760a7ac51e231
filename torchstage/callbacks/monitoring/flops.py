"""FLOPs for MFU: counted on a real step with ``torch.utils.flop_counter``, and dense peaks of known GPUs."""
import logging

import torch

logger = logging.getLogger("torchstage")

#: Dense peak FLOP/s per GPU (no sparsity): (16-bit tensor cores, TF32, FP32), from the vendors' data sheets.
GPU_PEAKS = (
    ("H100 PCIe", (756e12, 378e12, 51e12)), ("H100", (989e12, 494e12, 67e12)), ("H200", (989e12, 494e12, 67e12)),
    ("A100", (312e12, 156e12, 19.5e12)), ("A10", (125e12, 62.5e12, 31.2e12)), ("L40S", (362e12, 183e12, 91.6e12)),
    ("L4", (121e12, 60e12, 30.3e12)), ("V100", (125e12, 15.7e12, 15.7e12)), ("T4", (65e12, 8.1e12, 8.1e12)),
)


def device_peak_flops(device: torch.device, amp_dtype=None):
    """The dense peak FLOP/s of ``device`` for the run's precision, or None if unknown (CPUs, other GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, (half, tf32, fp32) in GPU_PEAKS:
        if key in name:
            if amp_dtype in (torch.float16, torch.bfloat16):
                return half
            return tf32 if _tf32_matmuls() else fp32
    return None


def _tf32_matmuls() -> bool:
    """Whether float32 matmuls on CUDA run in TF32. torch >= 2.9 says it in ``fp32_precision`` ("none": the global
    setting's); its legacy ``allow_tf32`` raises once the new API set the precision."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:  # an older torch
        return bool(matmul.allow_tf32)
    if precision == "none":
        precision = getattr(torch.backends, "fp32_precision", "ieee")
    return precision == "tf32"


class StepFlops:
    """Counts the FLOPs of what runs between :meth:`start` and :meth:`stop` (one batch: forward, backward)."""

    def __init__(self):
        self._mode = None

    def start(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode  # only for the counted batch
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()

    def stop(self):
        """The FLOPs counted (None if counting failed, e.g. under a compiled model)."""
        mode, self._mode = self._mode, None
        if mode is None:
            return None
        mode.__exit__(None, None, None)
        total = mode.get_total_flops()
        return total or None

    def abort(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
