"""A griffe extension for the API reference: our docstrings' reST inline markup, as Markdown.

The package's docstrings are written for ``help()`` and reST readers (``:class:`Task```,
``Example::``). mkdocstrings renders Markdown, where those roles would show as raw text, so
this turns each role into inline code and a ``::`` that opens a literal block into ``:``
(the indented block after it is already a Markdown code block). Nothing else is touched.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# :class:`~sa_jobqueue.Task` -> `Task`; :meth:`enqueue` -> `enqueue`
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`~?\.?([^`]+)`")
LITERAL_BLOCK = re.compile(r"(\S)::$", flags=re.M)


def markdown(text: str) -> str:
    """The docstring's text with reST roles as inline code and ``::`` openers as ``:``."""
    return LITERAL_BLOCK.sub(r"\1:", ROLE.sub(r"`\1`", text))


class RestRoles(griffe.Extension):
    """Rewrites every docstring griffe loads (modules, classes, functions, attributes)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
