"""expand_hostlist: each form by hand, then 240 random expressions against ``scontrol show hostnames``."""
import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.launch.slurm.slurm_cluster import slurm_cluster  # noqa: F401
from torchstage.launch.slurm.hostlist import expand_hostlist
from torchstage.launch.slurm.step import SlurmConfigError, expand_tasks_per_node


@pytest.mark.parametrize("expr, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("gpu-a[1-2],login3", ["gpu-a1", "gpu-a2", "login3"]),
    ("n[1-2]x[3-4]", ["n1x3", "n1x4", "n2x3", "n2x4"]),
    ("a[1-2]b[3-4]c[5-6]", ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"]),
    ("node[8-10]", ["node8", "node9", "node10"]),
    ("node[008-010]", ["node008", "node009", "node010"]),
    ("node[01-3]", ["node01", "node02", "node03"]),
    ("a,b,c", ["a", "b", "c"]),
    ("  a, b\tc\n", ["a", "b", "c"]),
    ("a,,b,", ["a", "b"]),
    ("node1", ["node1"]),
    ("node[3,1]", ["node3", "node1"]),      # SLURM keeps the given order
    ("n[1-2],n[1-2]", ["n1", "n2", "n1", "n2"]),  # and duplicates
    ("[1-2]", ["1", "2"]),
    ("", []),
])
def test_forms(expr, hosts):
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr, match", [
    ("node[3-1]", "reversed"),
    ("node[x]", "bad range 'x'"),
    ("node[]", "bad range"),
    ("node[1,,2]", "bad range"),
    ("node[1-2", "unclosed"),
    ("node1-2]", "unbalanced"),
    ("node[[1]]", "nested"),
    ("node[1-2]-ib", "no text after"),
    ("node[1-70000]", "over 65536"),
])
def test_bad_input_names_expression(expr, match):
    with pytest.raises(ValueError, match=match) as err:
        expand_hostlist(expr)
    assert repr(expr) in str(err.value)


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x2),1") == [2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(SlurmConfigError, match="2x"):
        expand_tasks_per_node("2x")


def _random_expr(rng: random.Random) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"

    def text(first_letter=True):
        body = "".join(rng.choice(letters + "-" + "0123456789") for _ in range(rng.randint(0, 4)))
        return (rng.choice(letters) if first_letter else "") + body

    def group():
        parts = []
        for _ in range(rng.randint(1, 3)):
            lo, width = rng.randint(0, 120), rng.choice([1, 1, 2, 3])
            if rng.random() < 0.6:
                parts.append(f"{lo:0{width}d}-{lo + rng.randint(0, 12):0{width}d}")
            else:
                parts.append(f"{lo:0{width}d}")
        return "[" + ",".join(parts) + "]"

    items = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.2:
            items.append(text() + str(rng.randint(0, 99)))                     # plain name
        elif kind < 0.7:
            items.append(text() + group())                                       # one bracket group
        else:
            items.append(text() + "".join(text(False) + group() for _ in range(rng.randint(2, 3))))
    return rng.choice([",", ", ", " "]).join(items)


def test_matches_scontrol(slurm_cluster):
    rng = random.Random(20240521)
    exprs = [_random_expr(rng) for _ in range(240)]

    def scontrol(expr):
        out = subprocess.run(["scontrol", "show", "hostnames", expr], env=slurm_cluster,
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "Invalid" not in out.stdout + out.stderr, (expr, out)
        return out.stdout.split()

    with ThreadPoolExecutor(8) as pool:
        expected = list(pool.map(scontrol, exprs))
    assert sum(len(e) for e in expected) > 2000
    multi = [x for x in exprs if any(item.count("[") > 1 for item in re.split("[, ]+", x))]
    assert len(multi) > 40  # multi-dimension forms are well covered
    for expr, hosts in zip(exprs, expected):
        assert expand_hostlist(expr) == hosts, expr
