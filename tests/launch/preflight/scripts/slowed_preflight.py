"""``torchstage preflight`` as one rank of any launcher (srun, torchrun, mpirun), slowed first as the environment asks
(see slow_down.py). torch and torchstage are imported before, so a rank to be slowed starts as fast as the others.

Usage (each rank): python slowed_preflight.py [preflight options]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402,F401 (imported before the process is slowed)
from slow_down import restored, slow_down_this_process  # noqa: E402

from torchstage.cli import main  # noqa: E402

if __name__ == "__main__":
    slow_down_this_process()
    with restored():
        code = main(["preflight", *sys.argv[1:]])
    sys.exit(code)
