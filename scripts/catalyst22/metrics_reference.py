"""Runs a scripts/catalyst22/metrics_*.py script on real Catalyst 22.04 with its original imports, by hand, to see
its numbers next to torchstage's (the tests run each script on Catalyst live, on the same machine, through
tests/catalyst/catalyst_reference.py).

Each line ending in ``# was: <import>`` is replaced by that import. On torch 2.x Catalyst 22.04 recognises a
scheduler only as a ``torch.optim.lr_scheduler._LRScheduler`` (which ``MultiStepLR`` and the others no longer
derive from), so without a fix it never steps one: this helper, and nothing in torchstage, points
``_LRScheduler`` at ``LRScheduler`` before Catalyst is imported.

Run (with ``catalyst==22.4`` and ``accelerate<0.30``: ``pip install -e ".[catalyst-reference]"``):
    python scripts/catalyst22/metrics_reference.py scripts/catalyst22/metrics_classification.py [ARGS...]
"""
import os
import re
import runpy
import sys
import tempfile

import torch.optim.lr_scheduler as lr_scheduler

WAS = re.compile(r"^(\s*).*#\s*was:\s*(.+?)\s*$")


def original_source(path: str) -> str:
    """The script with each ``... # was: <import>`` line replaced by ``<import>``."""
    lines = []
    for line in open(path).read().splitlines():
        match = WAS.match(line)
        lines.append(match.group(1) + match.group(2) if match else line)
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    lr_scheduler._LRScheduler = lr_scheduler.LRScheduler  # Catalyst 22.04's isinstance checks, on torch 2.x
    script, args = argv[0], argv[1:]
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(original_source(script))
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # its helpers (metrics_report.py), as python would
    runpy.run_path(file.name, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
