"""The docs cannot rot: every file they include exists and is exercised by a test."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def included_files():
    for page in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        for target in re.findall(r"```\{literalinclude\} (\S+)", open(page).read()):
            yield os.path.basename(page), os.path.normpath(os.path.join(ROOT, "docs", target))


def test_docs_include_examples():
    assert len(list(included_files())) >= 10


def test_every_included_file_exists_and_a_test_runs_it():
    tests = "\n".join(open(path).read() for path in glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
                      if not path.endswith("test_docs.py"))
    for page, path in included_files():
        assert os.path.isfile(path), f"{page} includes {path}, which does not exist"
        name = os.path.basename(path)
        assert name in tests, f"{page} includes {os.path.relpath(path, ROOT)} but no test mentions {name}"


def test_every_page_is_in_the_table_of_contents():
    index = open(os.path.join(ROOT, "docs", "index.md")).read()
    for page in glob.glob(os.path.join(ROOT, "docs", "*.md")):
        name = os.path.basename(page)[:-3]
        assert name == "index" or re.search(rf"^{re.escape(name)}$", index, re.M), f"{name} is not in docs/index.md"


def test_the_readme_links_every_page():
    """A user starts at the README: each page of docs/ is reachable from its documentation list (the log of past
    benchmark experiments is reached from benchmarks.md)."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    for page in glob.glob(os.path.join(ROOT, "docs", "*.md")):
        name = os.path.basename(page)
        assert name in ("index.md", "benchmarks-log.md") or f"(docs/{name})" in readme, f"README does not link {name}"
