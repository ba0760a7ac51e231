"""How busy a node is besides the job, from /proc: the numbers, and the doubt they cast on a verdict about a rank."""
import os
import signal
import subprocess
import sys
import time

from torchstage.launch.node_load import LoadMeter, NodeLoad, between, node_ticks


def test_doubt_names_oversubscription_other_work_on_full_cores_and_steal():
    assert NodeLoad("vm", 8, busy=4.0, own=4.0, steal=0.0, ranks=4).doubt() is None
    assert NodeLoad("vm", 8, busy=5.0, own=4.0, steal=0.0, ranks=4).doubt() is None  # other work, cores to spare
    assert NodeLoad("vm", 2, busy=1.9, own=0.6, steal=0.0, ranks=2).doubt() == (
        "other work used 1.3 of its 2 CPUs (this job 0.6), so the cores were full")
    assert NodeLoad("vm", 2, busy=2.0, own=2.0, steal=0.0, ranks=4).doubt() == "4 ranks on 2 CPUs take turns on the cores"
    assert NodeLoad("vm", 8, busy=2.0, own=2.0, steal=0.1, ranks=2).confidence() == (
        "low: host vm is shared: the hypervisor took 10% of its CPU time")


def test_between_reads_busy_cores_and_the_jobs_share():
    load = between("vm", 4.0, (0, 0, 0), (400, 100, 0), own_seconds=1.0, wall=1.0, ranks=1)
    assert (load.busy, load.own, load.others) == (3.0, 1.0, 2.0)


def test_the_meter_sees_a_busy_neighbour_as_other_work():
    assert node_ticks() is not None
    meter = LoadMeter("here", [os.getpid()])
    # a neighbour, not a child of this process (a child is the job's own, as a data-loader worker is)
    started = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
    neighbour = int(started.stdout.split()[0])
    try:
        time.sleep(1.5)
        load = meter.take()
    finally:
        os.kill(neighbour, signal.SIGKILL)
    assert load.others >= 0.5 and load.own < 0.3, load  # the neighbour is not the job (this idle process)


def test_the_jobs_processes_include_their_children():
    from torchstage.launch.node_load import process_ticks
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        assert process_ticks([os.getpid()]) - process_ticks([]) >= 30  # the busy child's ticks count as the job's
    finally:
        child.kill()
        child.wait()
