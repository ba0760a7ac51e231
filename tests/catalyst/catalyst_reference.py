"""Run a scripts/catalyst22/ script on real Catalyst 22.04 (its original imports): the reference numbers in
tests/catalyst/ were recorded with ``/tmp/catvenv/bin/python tests/catalyst/catalyst_reference.py SCRIPT [ARGS]``.

Each ``import ... # was: <original import>`` line of the script is put back to its original. Catalyst 22.04 on
torch 2.x needs one patch, applied here only: its scheduler check is ``isinstance(s, torch.optim.lr_scheduler.
_LRScheduler)``, which torch 2's schedulers no longer pass, so without it Catalyst never steps a scheduler.
"""
import os
import re
import runpy
import sys
import tempfile

import torch.optim.lr_scheduler

torch.optim.lr_scheduler._LRScheduler = torch.optim.lr_scheduler.LRScheduler  # before catalyst is imported


def catalyst_source(text: str) -> str:
    """The script as written for Catalyst: each ``<line>  # was: <original>`` becomes ``<original>``."""
    return re.sub(r"^(\s*)\S.*#\s*was:\s*(.+)$", r"\1\2", text, flags=re.MULTILINE)


def main(script: str, *args) -> None:
    with open(script) as f:
        source = catalyst_source(f.read())
    with tempfile.TemporaryDirectory() as folder:
        copy = os.path.join(folder, os.path.basename(script))
        with open(copy, "w") as f:
            f.write(source)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # the script's own helpers (common.py)
        sys.argv = [copy, *args]
        runpy.run_path(copy, run_name="__main__")


if __name__ == "__main__":
    main(*sys.argv[1:])
