"""A stage of a pipeline that stops: the hang watchdog names each rank's pipeline stage, the stage the others wait
for, and the send/recv between stages the waiting one is blocked in (issue 58). Real processes on gloo."""
import os
import sys

import pytest

from tests import script_server
from tests.helpers import ROOT, script_env

SCRIPT = os.path.join(ROOT, "tests", "strategies", "scripts", "pipeline_hang.py")
pytestmark = [pytest.mark.distributed, pytest.mark.waits, pytest.mark.timeout(300)]  # an 8 s hang_timeout


def test_a_stopped_stage_is_named_with_the_send_recv_its_neighbour_waits_in(tmp_path):
    result = script_server.run([sys.executable, SCRIPT, str(tmp_path)], env=script_env(), cwd=ROOT, timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 124, out[-3000:]
    assert "torchstage: hang detected on rank 1" in out, out[-3000:]
    assert "loader 'train', batch 3, pipeline stage 2 of 2 (after batch start); stopped in " in out, out[-3000:]
    assert "pipeline stage 1 of 2 (after batch start); waiting in a pipeline schedule's send/recv between " \
           "stages" in out, out[-3000:]
    assert "Stopped outside any collective (what the others wait for): rank 1." in out, out[-3000:]
