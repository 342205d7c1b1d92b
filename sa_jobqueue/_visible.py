"""Text from job rows made safe to show: every control character written out, not obeyed.

A job's payload, task name and error are whatever wrote them: a handler's exception message
can carry ESC sequences (colours, clearing the screen, setting a terminal's title), a carriage
return that lets later text overwrite earlier, or a bidirectional override that shows text in
another order than it is stored. The dashboard, the CLI's reports and the worker's text log
show each such character as ``\\xNN`` or ``\\uNNNN`` through :func:`visible`, so what a person
reads is what the row holds. It escapes nothing else: HTML is Jinja2's business. JSON text
goes through :func:`json_visible`, which writes the same characters as JSON escapes so that
the document still reads back to the same values.
"""

from __future__ import annotations

import re
from typing import Final

#: C0 controls but tab and line feed, DEL, C1 controls, and the bidirectional marks,
#: overrides and isolates and the line and paragraph separators, which can make text read in
#: another order or on other lines than it is stored.
HIDDEN: Final = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)
#: The same, with tab and line feed: for text that must stay on one line.
HIDDEN_ON_ONE_LINE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)

#: What ``json.dumps(..., ensure_ascii=False)`` leaves as it is and a terminal may obey: DEL,
#: the C1 controls, the bidirectional marks and the line and paragraph separators (it escapes
#: the C0 controls itself). In JSON text they occur only inside strings, where ``\\uNNNN``
#: stands for the same character.
RAW_IN_JSON: Final = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def visible(text: str, *, lines: bool = True) -> str:
    """``text`` with each control character written as ``\\xNN`` (``\\uNNNN`` past U+00FF).

    ``lines``: keep line feeds and tabs (a traceback); False writes them out too, for text
    that must stay on its one line (a table's cell, a log record's message).
    """
    return (HIDDEN if lines else HIDDEN_ON_ONE_LINE).sub(_escape_one, text)


def _escape_one(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def json_visible(document: str) -> str:
    """``document``, JSON from ``json.dumps(..., ensure_ascii=False)``, with :data:`RAW_IN_JSON`
    characters written as ``\\uNNNN`` escapes: it parses to the same value.

    Only for ``json.dumps`` output: other text may hold these characters outside strings, where
    an escape is not JSON. Other non-ASCII text (accents, CJK, emoji) stays as it is.
    """
    return RAW_IN_JSON.sub(_json_escape_one, document)


def _json_escape_one(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"
