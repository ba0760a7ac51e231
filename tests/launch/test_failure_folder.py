"""A launcher's failure folder: removed as it ends, and by the next launcher where a kill left it behind (the kill
itself: tests/launch/test_rank_start.py's killed launcher)."""
import os
import time

from torchstage.launch.failure_folder import LOCK, PREFIX, FailureFolder, sweep


def test_only_the_folders_of_dead_launchers_are_removed(tmp_path):
    live, dead, young = FailureFolder(str(tmp_path)), FailureFolder(str(tmp_path)), FailureFolder(str(tmp_path))
    os.close(dead._lock)  # what the kernel does when a killed launcher's last process is gone
    os.close(young._lock)
    old = time.time() - 60
    for folder in (live, dead):
        os.utime(os.path.join(folder.path, LOCK), (old, old))
    unlocked = tmp_path / f"{PREFIX}before-the-lock"  # torchstage's folders before 2026-11-30 have no lock file
    unlocked.mkdir()
    other = tmp_path / "another-program"
    other.mkdir()
    (tmp_path / f"{PREFIX}a-file").write_text("")
    assert sweep(str(tmp_path)) == [dead.path]  # a young one may not be locked yet
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(live.path), os.path.basename(young.path),
                                                   unlocked.name, other.name, f"{PREFIX}a-file"])


def test_an_attempt_starts_with_an_empty_folder_and_the_folder_goes_with_its_launcher(tmp_path):
    folder = FailureFolder(str(tmp_path))
    (tmp_path / os.path.basename(folder.path) / "rank-1.json").write_text("{}")
    folder.clear()
    assert os.listdir(folder.path) == [LOCK]
    folder.remove()
    assert not os.path.exists(folder.path) and sweep(str(tmp_path), settle=0) == []
