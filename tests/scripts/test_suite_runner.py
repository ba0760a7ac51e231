"""CI tells the truth: copies of .ci/run and scripts/test.sh, with stub commands that fail one part, exit non-zero,
still run the parts after a failed test part, and end with a table naming the part that failed."""
import os
import re
import shutil
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every command .ci/run starts that would install, start daemons or run tests: each logs its arguments and fails
# when they contain $STUB_FAIL (a pytest part's stub prints a summary line like pytest's).
STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*${TORCHSTAGE_PARTS_ROWS:+ (sees TORCHSTAGE_PARTS_ROWS)}" >> "$STUB_CALLS"
case "$*" in *pytest*) echo "3 passed in 0.10s";; esac
if [[ -n ${STUB_FAIL:-} && "$(basename "$0") $*" == *"$STUB_FAIL"* ]]; then
  echo "stub failure: $STUB_FAIL"; exit 1
fi
"""


@pytest.fixture
def tree(tmp_path):
    """A copy of .ci/run and scripts/test.sh, with python3, the SLURM script and the MPI launchers as stubs."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "bin").mkdir()
    shutil.copy(os.path.join(ROOT, ".ci", "run"), tmp_path / ".ci" / "run")
    shutil.copy(os.path.join(ROOT, "scripts", "test.sh"), tmp_path / "scripts" / "test.sh")
    for path in (tmp_path / "scripts" / "slurm-local.sh", *(tmp_path / "bin" / n for n in
                                                           ("python3", "mpirun", "mpiexec.mpich"))):
        path.write_text(STUB)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def run(tree, command, fail="", **env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHSTAGE_TEST_SEED", "TORCHSTAGE_PARTS_ROWS")}
    env.update(PATH=f"{tree / 'bin'}{os.pathsep}{os.environ['PATH']}", STUB_FAIL=fail, STUB_CALLS=str(tree / "calls"),
               **env_extra)
    result = subprocess.run(["bash", *command], cwd=tree, env=env, capture_output=True, text=True, timeout=60)
    calls = (tree / "calls").read_text().splitlines() if (tree / "calls").exists() else []
    return result, calls


def table_row(stdout, part):
    """The exit code in the closing table's row of `part`."""
    rows = stdout.split("\npart ")[-1].splitlines()
    return next(int(row.split()[1]) for row in rows if row.split()[0] == part)


def pytest_calls(calls):
    return [c for c in calls if "pytest" in c]


def test_ci_run_passes_when_every_part_passes_and_runs_every_part(tree):
    result, calls = run(tree, [".ci/run"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(pytest_calls(calls)) == 3 and sum("sphinx" in c for c in calls) == 1
    assert any("slurm-local.sh up" in c for c in calls)
    for part in ("install-torch", "slurm-up", "install", "parallel", "waits", "alone", "docs"):
        assert table_row(result.stdout, part) == 0
    assert "3 passed in 0.10s" in result.stdout.split("\npart ")[-1]  # each pytest part's summary line


@pytest.mark.parametrize("fail, part", [("not alone", "parallel"), ("-m waits", "waits"), ("-m alone", "alone"),
                                        ("sphinx", "docs")])
def test_ci_run_fails_when_a_part_fails_and_still_runs_the_others(tree, fail, part):
    result, calls = run(tree, [".ci/run"], fail=fail)
    assert result.returncode != 0, result.stdout
    assert table_row(result.stdout, part) == 1 and "FAILED: 1 part(s)" in result.stdout
    # one run shows every failure: the parts after the failed one ran too
    assert len(pytest_calls(calls)) == 3 and sum("sphinx" in c for c in calls) == 1
    assert any("slurm-local.sh down" in c for c in calls)  # the cluster is stopped on the way out


@pytest.mark.parametrize("fail, step", [("pip install -q torch", "install-torch"), ("slurm-local.sh up", "slurm-up"),
                                        ("pip install -q -e", "install")])
def test_ci_run_stops_with_an_error_when_an_install_or_the_cluster_fails(tree, fail, step):
    result, calls = run(tree, [".ci/run"], fail=fail)
    assert result.returncode != 0, result.stdout
    assert table_row(result.stdout, step) == 1
    assert not pytest_calls(calls)  # no test part runs on a broken installation


@pytest.mark.parametrize("fail", ["not alone", "-m waits", "-m alone"])
def test_the_readme_test_command_fails_when_any_part_fails(tree, fail):
    result, calls = run(tree, ["scripts/test.sh"], fail=fail)
    assert result.returncode != 0 and "FAILED: 1 part(s)" in result.stdout
    assert len(pytest_calls(calls)) == 3
    result, calls = run(tree, ["scripts/test.sh"])
    assert result.returncode == 0, result.stdout


def test_the_rows_file_gets_this_runs_parts_and_no_command_a_part_runs_sees_it(tree):
    """.ci/run reads the parts' rows from TORCHSTAGE_PARTS_ROWS; a test inside a part that runs this script must not
    add its own rows there (CI's table once counted a stub's failures as the suite's)."""
    rows = tree / "rows"
    result, calls = run(tree, ["scripts/test.sh"], TORCHSTAGE_PARTS_ROWS=str(rows))
    assert result.returncode == 0, result.stdout
    assert [line.split("\t")[1].split()[0] for line in rows.read_text().splitlines()] == ["parallel", "waits", "alone"]
    assert len(pytest_calls(calls)) == 3 and not [c for c in calls if "sees TORCHSTAGE_PARTS_ROWS" in c]


def test_every_part_runs_in_one_printed_random_order_that_a_seed_replays(tree):
    result, calls = run(tree, ["scripts/test.sh"])
    seed = re.search(r"test order seed (\d+)", result.stdout)[1]
    assert f"TORCHSTAGE_TEST_SEED={seed} bash scripts/test.sh" in result.stdout  # how to replay it
    assert len(pytest_calls(calls)) == 3
    assert all(f"-p randomly --randomly-seed={seed}" in c for c in pytest_calls(calls))
    tree.joinpath("calls").unlink()
    result, calls = run(tree, ["scripts/test.sh"], TORCHSTAGE_TEST_SEED="4242")
    assert "test order seed 4242" in result.stdout
    assert all("-p randomly --randomly-seed=4242" in c for c in pytest_calls(calls))


def test_the_readme_opens_with_the_install_and_the_test_command_of_ci():
    """The README's first commands are the ones CI runs: the same extras (CI adds the docs') and scripts/test.sh."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    first_block = readme.split("```bash\n")[1].split("```")[0]
    test_line = next(line for line in first_block.splitlines() if "scripts/test.sh" in line)
    assert test_line.startswith("pip install torch==2.13.0 && pip install -e") and test_line.endswith(
        "&& bash scripts/test.sh")
    readme_extras = set(re.search(r'-e "\.\[([^\]]+)\]"', test_line)[1].split(","))
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    ci_extras = set(re.search(r'-e "\.\[([^\]]+)\]"', ci)[1].split(","))
    assert ci_extras - readme_extras == {"docs"} and readme_extras <= ci_extras
    assert "torch==2.13.0" in ci
