"""docs/api.md documents every train() argument: type, default, what it does, the page that explains it."""
import os
import re

from torchstage.runner.spec import train_arguments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_train_argument_has_a_complete_row():
    text = open(os.path.join(ROOT, "docs", "api.md")).read()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|(.*)\|$", text, re.M)}
    assert set(rows) == set(train_arguments())
    for name, row in rows.items():
        kind, default, what, pages = (cell.strip() for cell in row.split(" | "))
        assert kind and default and len(what) > 20, name
        linked = re.findall(r"\{doc\}`([\w-]+)`", pages)
        assert linked and all(os.path.isfile(os.path.join(ROOT, "docs", f"{page}.md")) for page in linked), name


def test_the_docs_index_opens_with_the_install_command_and_the_example():
    index = open(os.path.join(ROOT, "docs", "index.md")).read()
    toc = index.index("{toctree}")
    assert 0 < index.index("pip install") < index.index("{literalinclude} ../scripts/tutorial.py") < toc
    assert 'copyright = "the torchstage developers"' in open(os.path.join(ROOT, "docs", "conf.py")).read()
