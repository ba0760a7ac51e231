"""Riders of the agreement channel under 2 real gloo ranks: each rank's numbers in its slots come back to every rank
with the stop request (itself a rider), next to the interval the ranks proposed."""
import json
import re
import sys

import pytest

from tests import script_server
from tests.helpers import ROOT, script_env

SCRIPT = """
import json, sys, torch, torch.distributed as dist
from torchstage.callbacks.safety.stop import StopVote
from torchstage.distributed.agreement import Agreement, Rider as ChannelRider
from torchstage.stop_request import request_stop
dist.init_process_group("gloo")
rank = dist.get_rank()

class Rider(ChannelRider):
    def __init__(self, width):
        self.width, self.got = width, None
    def payload(self):
        values = torch.zeros(2 * self.width, dtype=torch.int64)
        values[rank * self.width:(rank + 1) * self.width] = torch.arange(1, self.width + 1) * (10 ** rank)
        return values
    def arrived(self, values):
        self.got = values.tolist()

one, two, vote = Rider(2), Rider(3), StopVote()
if rank == 1:
    request_stop("test", exit_code=7)
agreement = Agreement((one, vote, two), None, 4 + rank)
interval = agreement.result()
print(json.dumps({"rank": rank, "one": one.got, "two": two.got, "interval": interval,
                  "exit_code": vote.agreed.exit_code}), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.distributed
@pytest.mark.timeout(200)
def test_riders_get_every_ranks_numbers_with_the_stop_request(tmp_path):
    script = tmp_path / "riders.py"
    script.write_text(SCRIPT)
    result = script_server.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(script)], env=script_env(), cwd=ROOT, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # the two ranks print to one pipe: a line may hold both reports (each a flat object)
    reports = sorted((json.loads(text) for text in re.findall(r"\{[^{}]*\}", result.stdout)), key=lambda r: r["rank"])
    assert len(reports) == 2
    for report in reports:
        assert report["one"] == [1, 2, 10, 20] and report["two"] == [1, 2, 3, 10, 20, 30]
        assert report["interval"] == 4 and report["exit_code"] == 7  # the smallest proposal; rank 1's request
