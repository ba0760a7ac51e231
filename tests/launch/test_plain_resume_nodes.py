"""A plain resume="last" of a 2-process run by a new command on the same host names no lost or joined node."""
import sys

import pytest

from tests import script_server
from tests.resume_helpers import ROOT, child_env

SCRIPT = ("import sys\nfrom tests.resume_helpers import tiny_train_kwargs\nfrom torchstage import SupervisedRunner\n"
          "SupervisedRunner().train(**tiny_train_kwargs(sys.argv[1], num_epochs=int(sys.argv[2]), "
          "resume=sys.argv[3] or None), distributed=True, nprocs=2)\n")


@pytest.mark.distributed
def test_a_plain_resume_on_the_same_host_says_no_node_was_lost(tmp_path):
    def run(epochs, resume):
        done = script_server.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(epochs), resume], env=child_env(),
                                 cwd=ROOT, timeout=240, merge=True)
        assert done.returncode == 0, done.stdout[-3000:]
        return done.stdout
    run(1, "")
    out = run(2, "last")
    assert "resuming from" in out and "lost node" not in out and "joined node" not in out, out[-3000:]
