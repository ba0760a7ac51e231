"""A Catalyst 20.12-style script (custom _handle_batch runner, 20.12 callback arguments, fp16=True) on 2 ranks."""
from pathlib import Path
import json

import pytest

from tests.helpers import run

pytestmark = pytest.mark.distributed

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.mark.timeout(200)
def test_catalyst_style_custom_runner_trains_on_two_gloo_ranks(tmp_path):
    result = run([SCRIPTS / "catalyst20_ddp.py", tmp_path], nproc=2, timeout=170)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report-rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in reports] == [2, 2]
    assert reports[0]["valid"] == reports[1]["valid"] and reports[0]["weight"] == reports[1]["weight"]
    assert reports[0]["valid"]["accuracy01"] > 0.8
    output = result.stdout + result.stderr
    assert output.count("train(fp16=...) is Catalyst 20.12's spelling") == 1  # notes: main rank only
    assert output.count("this run on cpu trains in full precision (float32), as Catalyst did") == 1  # main rank
