"""Sphinx configuration: Markdown pages through MyST, API reference from docstrings."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "torchstage"
author = "the torchstage developers"
copyright = "the torchstage developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
html_theme = "alabaster"
nitpicky = False
