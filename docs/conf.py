"""Sphinx configuration of the documentation site (``make docs``). The pages are
Markdown, read by MyST; the API reference is taken from the package's docstrings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import django
from django.conf import settings

if TYPE_CHECKING:
    from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# autodoc imports the package, which needs Django set up with the app installed (and,
# on Django 5.2, the tasks framework's backport).
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django_redisqueue",
        *(["django_tasks"] if django.VERSION < (6, 0) else []),
    ],
    TASKS={"default": {"BACKEND": "django_redisqueue.backend.RedisQueueBackend"}},
    USE_TZ=True,
)
django.setup()

project = "django-redisqueue"
author = "the django-redisqueue authors"
copyright = "the django-redisqueue authors"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Links to headings of other pages, as GitHub makes them ("page.md#a-heading").
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# No network when the site is built (CI has none), so no intersphinx: references to
# Python's, Django's or redis-py's objects cannot resolve and are left unchecked. The
# package's own must resolve.
nitpick_ignore_regex = [(r"py:.*", r"(?!django_redisqueue\.).*")]
# Internal: the counts a GroupResult holds, shown to users through its properties.
nitpick_ignore = [("py:class", "django_redisqueue.core.fanout.GroupState")]

autodoc_member_order = "bysource"
# Only this app's docstrings: the ones inherited from Django's classes are Django's to
# document (and are not all reStructuredText).
autodoc_inherit_docstrings = False
autodoc_typehints = "signature"
autodoc_typehints_format = "short"

html_theme = "furo"
html_title = "django-redisqueue"
html_static_path: list[str] = []


def _drop_dataclass_signatures(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """A dataclass without a docstring gets its signature as one; the page shows the
    class's own words instead."""
    if what == "class" and lines and lines[0].startswith(f"{obj.__name__}("):
        lines.clear()


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-docstring", _drop_dataclass_signatures)
