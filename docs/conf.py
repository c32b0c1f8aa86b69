"""Sphinx configuration: the guides in docs/*.md (MyST) and the API reference
generated from the docstrings (docs/api.rst, autodoc).  ``make docs`` builds it
with -W: a warning fails the build, and CI runs it."""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

with open(os.path.join(ROOT, "kina_fx", "__init__.py")) as f:
    release = version = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

project = "kina_fx"
author = "The kina_fx authors"
copyright = "the kina_fx authors, MIT License"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"


def setup(app):
    # Pygments has no MLIR lexer: show MLIR blocks as plain text rather than
    # warn (a warning fails `make docs`).
    from pygments.lexers.special import TextLexer
    from sphinx.highlighting import lexers

    lexers["mlir"] = TextLexer()
html_title = f"kina_fx {release}"
