"""The ``torchstage`` command's help, version and argument errors."""
import pytest

import torchstage
from torchstage.cli import main


def help_of(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_the_commands(capsys):
    out = help_of(capsys)
    assert out.startswith("usage: torchstage [-h] [--version] COMMAND ...")
    assert "run       train from YAML config files" in out and "plot      plot a run's logged metrics" in out


def test_run_help_documents_every_option(capsys):
    out = help_of(capsys, "run")
    for text in ("-C FILE [FILE ...], --config FILE [FILE ...]", "--set KEY.PATH=VALUE", "--dry-run",
                 "examples:", "exit status: 0 on success, 2 on a config error"):
        assert text in out


def test_plot_help(capsys):
    out = help_of(capsys, "plot")
    assert "usage: torchstage plot [-h] [-o PNG] LOGDIR" in out and "pip install 'torchstage[plot]'" in out


def test_version_and_missing_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"torchstage {torchstage.__version__}\n"
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2 and "the following arguments are required: COMMAND" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["run"])
    assert exit_info.value.code == 2 and "-C/--config" in capsys.readouterr().err
