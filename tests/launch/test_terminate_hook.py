"""A last word before a C++ abort: the function runs once when the process ends in std::terminate, then the
process aborts as before; restored, the handler before is back."""
import signal
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SCRIPT = """
import ctypes, sys
from torchstage.launch.terminate_hook import on_terminate
restore = on_terminate(lambda: open(sys.argv[1], "a").write("last word\\n"))
if sys.argv[2] == "restored":
    restore()
getattr(ctypes.CDLL("libstdc++.so.6"), "_ZSt9terminatev")()  # std::terminate(), as an escaped C++ exception does
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libstdc++'s std::set_terminate")
@pytest.mark.parametrize("mode", ["installed", "restored"])
def test_the_function_runs_before_the_abort_and_not_once_restored(tmp_path, mode):
    said = tmp_path / "said"
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(said), mode], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == -signal.SIGABRT, result.stderr
    assert (said.read_text() if said.exists() else "") == ("last word\n" if mode == "installed" else "")
