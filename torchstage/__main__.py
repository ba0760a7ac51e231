"""``python -m torchstage ...`` (e.g. under ``torchrun -m torchstage run -C config.yml``)."""
import sys

from torchstage.cli import main

sys.exit(main())
