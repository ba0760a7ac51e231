"""Whether a file can be a checkpoint at all: torchstage writes only ``torch.save``'s zip archives, so a file that
does not begin like one (text, ``/etc/passwd``, a link to another file) is said to be no checkpoint, by name,
instead of reaching torch's legacy unpickler (``KeyError: 101``)."""
import os
import zipfile

ZIP_MAGIC = b"PK"  # a local file header (PK\x03\x04) or, for an empty archive, the end record (PK\x05\x06)


def not_a_checkpoint(path: str):
    """Why ``path`` is no checkpoint file (``"it begins with b'hello'"``), or None where it may be one (a zip
    archive, even a truncated or damaged one, and an empty file: the loader says what is wrong with those)."""
    with open(path, "rb") as f:
        head = f.read(16)
    if not head or head.startswith(ZIP_MAGIC) or zipfile.is_zipfile(path):  # damaged at the start, directory intact
        return None
    begins = f"begins with {head!r}"
    if os.path.islink(path):
        return f"it is a link to {os.path.realpath(path)!r}, which {begins}"
    return f"it {begins}"
