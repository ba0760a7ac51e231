"""DeepSpeed's op built on first use (``deepspeed_shm_comm`` on CPU): said once, where and how long, not by every rank.

DeepSpeed compiles the op with torch's JIT extension builder into ``$TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions/<python>_<device>/``) the first time a run needs it, which takes a minute or more;
later runs load it. Every rank prints that the op was built, and every rank repeats torch.distributed's
deprecation warnings: the main rank's lines are enough.
"""
import contextlib
import io
import logging
import os
import time
import warnings

logger = logging.getLogger("torchstage")
_BUILDER = "ShareMemCommBuilder"


def quiet_other_ranks(engine) -> None:
    """On ranks other than the main one: hide the FutureWarnings of torch.distributed that the main rank shows."""
    if not engine.is_main:
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed\.")


@contextlib.contextmanager
def op_build(deepspeed, engine):
    """Around ``deepspeed.initialize``: the main rank says when the op is built (where, and then how long it took);
    the other ranks' prints during the call (the op's "built successfully") are dropped (``sys.stdout`` is replaced
    for the call, in the whole process; DeepSpeed's logger and errors are not affected)."""
    folder = _build_folder(deepspeed) if engine.is_main else None
    building = folder is not None and not any(name.endswith(".so") for name in _names(folder))
    if building:
        logger.info("DeepSpeed's %s op is built into %s on its first use in this environment: a minute or more "
                    "(later runs load it; TORCH_EXTENSIONS_DIR puts the cache elsewhere)", os.path.basename(folder),
                    folder)
    started = time.monotonic()
    with contextlib.nullcontext() if engine.is_main else contextlib.redirect_stdout(io.StringIO()):
        yield
    if building and any(name.endswith(".so") for name in _names(folder)):
        logger.info("DeepSpeed's %s op built in %.0f s", os.path.basename(folder), time.monotonic() - started)


def _build_folder(deepspeed):
    """The folder torch builds DeepSpeed's communication op in, or None when this accelerator needs none."""
    try:
        builder = deepspeed.accelerator.get_accelerator().create_op_builder(_BUILDER)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            return None
        from torch.utils.cpp_extension import _get_build_directory  # torch's own rule for the folder
        return _get_build_directory(builder.name, verbose=False)
    except Exception:  # a DeepSpeed or torch without these: nothing to say
        return None


def _names(folder: str) -> list:
    try:
        return os.listdir(folder)
    except OSError:
        return []
