"""Atomic writes: a crash at any moment leaves the old file or the new one, never a mix."""
import contextlib
import errno
import itertools
import os

from torchstage.files.checkpoint_format import CheckpointError


def write_atomic_copies(paths: list, data: bytes, before_last=None) -> None:
    """:func:`write_atomic` of ``data`` to each of ``paths`` (independent files), in order, ``before_last()``
    (if given) run just before the last one, with one fsync of each folder after the last rename instead of
    one per file: two fsyncs fewer per epoch for last, best and a kept epoch file."""
    for index, path in enumerate(paths):
        if before_last is not None and index == len(paths) - 1:
            before_last()
        write_atomic(path, data, sync_folder=False)
    try:
        for folder in dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path in paths):
            fsync_folder(folder)
    except OSError as e:
        raise _write_error(paths[0], e) from e


def write_atomic_stream(paths: list, dump, before_last=None) -> None:
    """``dump(file)`` writes the content once, into the first of ``paths``; each further path gets a copy of the
    bytes written (read back from the first). Every file is atomic and fsynced, landed in order,
    ``before_last()`` (if given) run just before the last, and each folder fsynced once at the end."""
    first = paths[0]
    for index, path in enumerate(paths):
        if before_last is not None and index == len(paths) - 1:
            before_last()
        _write_atomic_with(path, dump if index == 0 else _copier(first))
    try:
        for folder in dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path in paths):
            fsync_folder(folder)
    except OSError as e:
        raise _write_error(first, e) from e


def _copier(source: str):
    def copy(file) -> None:
        with open(source, "rb") as original:
            while True:
                chunk = original.read(1 << 24)
                if not chunk:
                    return
                file.write(chunk)
    return copy


def _write_atomic_with(path: str, dump) -> None:
    """:func:`write_atomic` of what ``dump(file)`` writes into an open binary file, without the folder fsync."""
    def fill(fd: int) -> None:
        with os.fdopen(fd, "wb") as file:
            dump(file)
            file.flush()
            os.fsync(file.fileno())
    _replace_with(path, fill)


def write_atomic(path: str, data: bytes, durable: bool = True, sync_folder: bool = True) -> None:
    """Write ``data`` to ``path`` so that a crash at any moment leaves the old file or the new one.

    A temporary file in the same folder is written and (``durable``: checkpoints) fsynced, then renamed over
    ``path`` (and the folder fsynced, unless ``sync_folder=False``: the caller does it once). Logs pass
    ``durable=False``: still atomic for a crash of the process, and a power loss costs at most their last
    rows, which the checkpoint's copy rewrites on resume. Five system calls a file (open, write, fsync,
    close, rename): in the file writer thread each one lets the training thread wait for the GIL.
    """
    def fill(fd: int) -> None:
        try:
            view = memoryview(data)
            while view:  # a single write() may write less than asked (over 2 GiB at once on Linux)
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    _replace_with(path, fill)
    if durable and sync_folder:
        try:
            fsync_folder(os.path.dirname(os.path.abspath(path)))
        except OSError as e:
            raise _write_error(path, e) from e


def _replace_with(path: str, fill) -> None:
    """Create a temporary file beside ``path``, let ``fill(fd)`` write and close it, rename it over ``path``;
    on failure remove it and raise :class:`CheckpointError` (the old file, if any, is unchanged)."""
    tmp = None
    try:
        fd, tmp = _create_temporary(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
        fill(fd)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise _write_error(path, e) from e
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)


_temporary_numbers = itertools.count()


def _create_temporary(folder: str, name: str) -> tuple:
    """``(fd, path)`` of a new empty file ``.<name>.<pid>.<n>.tmp`` in ``folder`` (made if missing), open for
    writing with the permissions ``open()`` gives; a name no other writer uses (``O_EXCL``)."""
    for _ in range(1000):
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{next(_temporary_numbers)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
        except FileExistsError:  # left by a process that had this pid and was killed mid-write
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", folder)


def fsync_folder(folder: str) -> None:
    """fsync ``folder``: the names made, renamed or removed in it survive a power loss."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_error(path: str, error: OSError) -> CheckpointError:
    return CheckpointError(f"could not write {'checkpoint ' if path.endswith('.pth') else ''}{path!r}: "
                           f"{error.strerror or error}; the previous file, if any, is unchanged")
