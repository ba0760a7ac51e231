"""SLURM hostlists: ``node[01-04,07]`` and friends expanded exactly as ``scontrol show hostnames`` does."""
import re
from itertools import product

MAX_RANGE = 65536  # SLURM refuses a bracket range of more hosts than this ("Too many hosts")


def expand_hostlist(expr: str) -> list:
    """Host names of a SLURM hostlist (``node[01-04,07]``, ``gpu-a[1-2],login3``, ``n[1-2]x[3-4]``).

    Same names and order as ``scontrol show hostnames``: no sorting, no de-duplication. Items are
    separated by commas or whitespace; with several bracket groups SLURM varies the last group
    fastest, then the first, second, ... (so ``a[1-2]b[3-4]c[5-6]`` starts a1b3c5 a1b3c6 a2b3c5).
    """
    if not isinstance(expr, str):
        raise TypeError(f"hostlist must be a str, got {type(expr).__name__}")
    hosts, item, depth = [], "", 0
    for ch in expr + ",":
        if depth == 0 and (ch == "," or ch.isspace()):
            if item:
                hosts.extend(_expand_item(item, expr))
            item = ""
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth not in (0, 1):
            raise ValueError(f"invalid hostlist {expr!r}: unbalanced or nested brackets")
        item += ch
    if depth:
        raise ValueError(f"invalid hostlist {expr!r}: unclosed '['")
    return hosts


def _expand_item(item: str, expr: str) -> list:
    parts = re.split(r"\[([^\[\]]*)\]", item)  # text, ranges, text, ranges, ..., text
    texts, groups = parts[0::2], [_parse_ranges(r, expr) for r in parts[1::2]]
    if "]" in "".join(texts) or "[" in "".join(texts):
        raise ValueError(f"invalid hostlist {expr!r}: stray bracket in {item!r}")
    if not groups:
        return [item]
    if texts[-1]:
        raise ValueError(f"invalid hostlist {expr!r}: SLURM allows no text after the last ']' in {item!r}")
    # SLURM's nesting, outermost first: groups n-1, ..., 2, 1, then group n innermost.
    order = list(range(len(groups) - 2, -1, -1)) + [len(groups) - 1]
    hosts = []
    for combo in product(*(groups[g] for g in order)):
        value = dict(zip(order, combo))
        hosts.append("".join(texts[g] + value[g] for g in range(len(groups))))
    return hosts


def _parse_ranges(spec: str, expr: str) -> list:
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"invalid hostlist {expr!r}: bad range {part!r} in [{spec}]")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo or hi - lo >= MAX_RANGE:
            raise ValueError(f"invalid hostlist {expr!r}: range {part!r} is reversed or over {MAX_RANGE} hosts")
        width = len(m[1])  # SLURM zero-pads to the width of the lower bound
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out
