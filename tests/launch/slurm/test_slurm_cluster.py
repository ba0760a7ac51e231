"""The cluster fixture's policy: skip where SLURM cannot run, but fail under CI=true."""
import pytest

from tests.launch.slurm import slurm_cluster as helper


def test_skip_locally_fail_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no slurm here"):
        helper.skip_or_fail("no slurm here")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and no slurm here"):
        helper.skip_or_fail("no slurm here")


def test_not_root_is_a_reason(monkeypatch):
    monkeypatch.setattr(helper.os, "geteuid", lambda: 1000)
    assert "root" in helper.unavailable_reason()


def test_clean_env_drops_enclosing_job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("MASTER_PORT", "1")
    env = helper.clean_env("/x/slurm.conf")
    assert env["SLURM_CONF"] == "/x/slurm.conf" and "SLURM_JOB_ID" not in env and "MASTER_PORT" not in env
