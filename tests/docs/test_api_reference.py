"""docs/api.md documents every train() argument: type, default, what it does, the page that explains it."""
import os
import re

from torchstage.runner.spec import train_arguments
from torchstage.runner.spec_stages import STAGE_KEYS
from torchstage.runner.train_arguments import PARTS, SHOWN_DEFAULTS, declared_arguments

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


def _shown(value) -> str:
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def test_the_tables_of_train_arguments_match_their_declaration():
    """A table per part, under its heading, with the declared arguments of that part in their order, each default
    as declared (or as SHOWN_DEFAULTS says it), *stage* on exactly the arguments a stage may set."""
    text = open(os.path.join(ROOT, "docs", "api.md")).read()
    sections = re.split(r"^### ", text.split("## `train()` arguments")[1].split("\n## ")[0], flags=re.M)[1:]
    tables = {section.splitlines()[0].strip(): re.findall(r"^\| `(\w+)` \|(.*)\|$", section, re.M)
              for section in sections}
    assert list(tables) == [part.heading for part in PARTS]
    declared = declared_arguments()
    for part in PARTS:
        rows = tables[part.heading]
        assert [name for name, _ in rows] == [a.name for a in declared if a.part is part], part.heading
        for (name, row), argument in zip(rows, [a for a in declared if a.part is part]):
            default, what = (cell.strip() for cell in row.split(" | ")[1:3])
            assert default.startswith(SHOWN_DEFAULTS.get(name, _shown(argument.default))), (name, default)
            assert what.startswith("*stage*") == (name in STAGE_KEYS), name


def test_the_docs_index_opens_with_the_install_command_and_the_example():
    index = open(os.path.join(ROOT, "docs", "index.md")).read()
    toc = index.index("{toctree}")
    assert 0 < index.index("pip install") < index.index("{literalinclude} ../scripts/tutorial.py") < toc
    assert 'copyright = "the torchstage developers"' in open(os.path.join(ROOT, "docs", "conf.py")).read()
