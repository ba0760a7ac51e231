"""One checkpoint file: one dict of tensors and plain values, serialized with checksums, loaded safely.

Layout (``format = "torchstage/1"``): models, optimizers, schedulers, scaler, callbacks, loop, rng, metrics, meta.
The file is ``torch.save``'s zip archive, whose every record (the pickled values and each tensor's bytes) carries
a CRC-32 that :func:`load_file` verifies (``torch.load`` does not), so bytes changed anywhere in the file are
caught. Files written before carry a ``checksum`` key over their content, still verified.
``torch.load(weights_only=True)`` reads it, so loading never runs pickled code.
"""
import io
import os
import pickle
import zipfile
import zlib

import torch
from torch.utils.serialization import config as serialization_config

from torchstage.files.checkpoint_format import FORMAT, CheckpointError
from torchstage.files.file_kind import not_a_checkpoint


def content_checksum(tree) -> int:
    """CRC32 over a checkpoint tree: keys, plain values, and each tensor's dtype, shape and bytes, in order.
    Only to verify files written before the zip records' CRCs were relied on (their ``checksum`` key)."""
    crc = 0

    def walk(node):
        nonlocal crc
        if isinstance(node, torch.Tensor):
            tensor = node.detach().cpu().contiguous()
            crc = zlib.crc32(f"T{tensor.dtype}{tuple(tensor.shape)}".encode(), crc)
            if tensor.numel():
                crc = zlib.crc32(tensor.reshape(-1).view(torch.uint8).numpy().tobytes(), crc)
        elif isinstance(node, dict):
            crc = zlib.crc32(f"D{len(node)}".encode(), crc)
            for key, value in node.items():
                crc = zlib.crc32(repr(key).encode(), crc)
                walk(value)
        elif isinstance(node, (list, tuple)):
            crc = zlib.crc32(f"L{len(node)}".encode(), crc)
            for value in node:
                walk(value)
        else:
            crc = zlib.crc32(repr(node).encode(), crc)

    walk(tree)
    return crc


def dump(checkpoint: dict, file) -> None:
    """Write ``checkpoint`` into the open binary ``file``, each record with its CRC-32 (even where a user turned
    torch's ``save.compute_crc32`` off)."""
    content = {k: v for k, v in checkpoint.items() if k != "checksum"}
    if serialization_config.save.compute_crc32:
        torch.save(content, file)
    else:
        with serialization_config.patch({"save.compute_crc32": True}):
            torch.save(content, file)


def serialize(checkpoint: dict) -> bytes:
    """The bytes :func:`dump` writes for ``checkpoint``: one pass in C instead of a Python walk over the state."""
    buffer = io.BytesIO()
    dump(checkpoint, buffer)
    return buffer.getvalue()


def damaged_record(path: str):
    """Where the zip archive ``path`` does not match its CRC-32s (``"record 'archive/data/3'"``), or None;
    None too for a file that is not a zip archive (``torch.load`` says what is wrong with it) and for one
    saved with torch's CRCs turned off (all zero; such a file of an older torchstage has its checksum)."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            if all(info.CRC == 0 for info in archive.infolist()):
                return None
            name = archive.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError) as e:  # a damaged directory or record header
        return f"the archive's structure ({e})"
    return None if name is None else f"record {name!r}"


def load_file(path: str, map_location="cpu") -> dict:
    """Load one checkpoint file with ``weights_only=True``, its CRC-32s and format verified; refuse a file that
    would need to run pickled code."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    why = not_a_checkpoint(path)
    if why is not None:
        raise CheckpointError(f"{path!r} is not a checkpoint: a torchstage checkpoint is a zip archive (torch.save's "
                              f"format), and this file is not one ({why})")
    damage = damaged_record(path)
    if damage is not None:
        raise CheckpointError(f"checkpoint {path!r} is damaged: its content does not match the checksum written "
                              f"with it (bytes changed after writing, in {damage})")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        detail = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line), "")
        raise CheckpointError(
            f"refused to load {path!r}: it holds objects that only unpickling code could rebuild, and "
            f"torchstage loads checkpoints with weights_only=True so that no code from a file ever runs "
            f"({unpickling_reason(e)})") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as e:
        size = os.path.getsize(path)
        detail = "the file is empty (0 bytes)" if size == 0 else f"the file ({size} bytes) is truncated or damaged"
        raise CheckpointError(f"could not read checkpoint {path!r}: {detail} ({e or type(e).__name__})") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(f"{path!r} is not a torchstage checkpoint: format is {found!r}, "
                              f"expected {FORMAT!r}")
    expected = checkpoint.pop("checksum", {}).get("crc32")  # files written before: a content checksum too
    if expected is not None and content_checksum(checkpoint) != expected:
        raise CheckpointError(f"checkpoint {path!r} is damaged: its content does not match the checksum written "
                              f"with it (bytes inside a tensor or value changed after writing)")
    return checkpoint




def unpickling_reason(error) -> str:
    """The line of torch's weights_only error that names the refused object."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Unsupported" in line or "global" in line.lower()]
    reason = (named or lines or ["unsupported object"])[0].replace("WeightsUnpickler error: ", "")
    return reason.split(" Please use")[0]  # torch's advice to allow-list the global is not ours to give
