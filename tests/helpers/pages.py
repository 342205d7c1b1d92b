"""Reading the dashboard's HTML in tests: its links, its forms, and a form's CSRF token."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Final

#: The base URL for a TestClient of the dashboard: by default it answers only this machine's
#: names (``Host: localhost``), not the client's own default ``testserver``.
LOCAL: Final = "http://localhost"


@dataclass
class Form:
    method: str
    action: str
    #: Each field's value; a list for a name given more than once (several hidden statuses).
    fields: dict[str, str | list[str]] = field(default_factory=dict)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.forms: list[Form] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        for name in ("href", "src"):
            if name in found:
                self.links.append(found[name])
        if tag == "form":
            self.forms.append(Form(found.get("method", "get").lower(), found.get("action", "")))
        elif (
            tag == "input"
            and self.forms
            and "name" in found
            and (found.get("type") not in ("checkbox", "radio") or "checked" in found)
        ):
            fields, name, value = self.forms[-1].fields, found["name"], found.get("value", "")
            if name not in fields:
                fields[name] = value
            else:
                before = fields[name]
                fields[name] = [*before, value] if isinstance(before, list) else [before, value]


def read(html: str) -> _Reader:
    reader = _Reader()
    reader.feed(html)
    reader.close()
    return reader


def links(html: str, *, posts: bool = True) -> list[str]:
    """Every ``href`` and ``src`` of the page, and its forms' actions (``posts``: POST ones too)."""
    reader = read(html)
    actions = [form.action for form in reader.forms if posts or form.method == "get"]
    return reader.links + actions


def forms(html: str, method: str = "post") -> list[Form]:
    """The page's forms of ``method``, each with its fields' values (checked boxes only)."""
    return [form for form in read(html).forms if form.method == method]


def post_form(html: str, action_ends: str) -> Form:
    """The one POST form whose action ends with ``action_ends``."""
    (form,) = [f for f in forms(html) if f.action.endswith(action_ends)]
    return form
