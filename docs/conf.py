# The caf-hvd guide: Sphinx with MyST (Markdown pages), built by scripts/docs.sh with
# warnings as errors. Sphinx rather than MkDocs: the Python API reference comes from the
# docstrings (autodoc), a page outside the table of contents and a broken cross-page
# reference are warnings that -W turns into failures, and it is what Horovod's, Ray's
# and torch's own sites are built with. All three packages are Debian's.
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

project = "caf-hvd"
author = "the caf-hvd developers"
copyright = "2026, the caf-hvd developers"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
master_doc = "index"
# cli.md is written by scripts/docs.sh from the --help texts (docs/reference/cli.md is
# never committed); the timeline's own files are data, not pages
exclude_patterns = ["_build", "timeline.html", "timeline-events.jsonl"]
myst_heading_anchors = 4
myst_enable_extensions = ["deflist"]
autodoc_member_order = "bysource"
autodoc_typehints = "none"
# imported only to read their docstrings: nothing of the job machinery starts
autodoc_mock_imports = ["cloudpickle", "horovod", "torch"]
suppress_warnings = []
nitpicky = False

try:
    import sphinx_rtd_theme  # noqa: F401

    html_theme = "sphinx_rtd_theme"
except ImportError:  # the guide still builds with Sphinx's own theme
    html_theme = "alabaster"
html_title = "caf-hvd guide"
html_static_path = ["_static"]
html_css_files = ["caf-hvd.css"]
html_show_sourcelink = False
