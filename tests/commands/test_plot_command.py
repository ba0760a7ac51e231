"""``torchstage plot``: exit codes and messages around torchstage.files.reports.plot."""
import csv

import pytest

from torchstage.cli import main

pytest.importorskip("matplotlib")


def test_plot_command_writes_the_png(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    for loader, losses in {"train": [1.0, 0.5, 0.3], "valid": [1.2, 0.7, 0.6]}.items():
        with open(tmp_path / "logs" / f"{loader}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["stage", "epoch", "global_epoch", "loss"])
            writer.writerows(["main", i + 1, i + 1, loss] for i, loss in enumerate(losses))
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "out.png")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'out.png'}\n"
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_command_error_exit_2(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("torchstage plot: error: no CSV logs in ")
