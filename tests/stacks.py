"""What a test's script was doing when it ran past its timeout: every Python stack of it and its descendants (ranks,
DataLoader workers, an ``mpirun``'s ranks), read live with py-spy before the script is killed, so that a hang seen
once on CI says where it hung."""
import os
import shutil
import subprocess

#: At most this many processes are read (a launcher, its ranks and their workers), each for at most this long.
MOST, EACH_SECONDS = 12, 15


def descendants(pid: int) -> list:
    """``pid`` and every process below it, parents first (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue.extend(sorted(children.get(current, ())))
    return found


def stacks(pid: int) -> str:
    """The Python stacks of ``pid``'s process tree (py-spy dump), or why they cannot be read."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "(no stacks: py-spy is not installed; pip install py-spy)"
    parts = []
    for each in descendants(pid)[:MOST]:
        try:
            with open(f"/proc/{each}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        try:
            dumped = subprocess.run([spy, "dump", "--pid", str(each)], capture_output=True, text=True,
                                    timeout=EACH_SECONDS)
            text = (dumped.stdout + dumped.stderr).strip()
        except subprocess.TimeoutExpired:
            text = f"(py-spy took over {EACH_SECONDS} s)"
        parts.append(f"--- pid {each}: {command[:200]}\n{text}")
    return "\n".join(parts)


class TimedOut(subprocess.TimeoutExpired):
    """``subprocess.TimeoutExpired`` whose message shows the end of the output and the stacks read before the kill."""

    def __init__(self, cmd, timeout, output=None, stderr=None, stacks_text=""):
        super().__init__(cmd, timeout, output, stderr)
        self.stacks = stacks_text

    def __str__(self):
        def tail(value):
            if value is None:
                return ""
            return (value.decode(errors="replace") if isinstance(value, bytes) else value)[-3000:]
        return (f"{super().__str__()}\n--- its output's end:\n{tail(self.output)}\n--- its stderr's end:\n"
                f"{tail(self.stderr)}\n--- the stacks when it was stopped:\n{self.stacks}")
