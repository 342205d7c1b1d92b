"""The workflow view's drawing: its SVG and its list by layer, as markup built in Python.

A workflow view draws up to 200 jobs and 2,000 edges; as a Jinja2 loop, each of their
dozen values went through the template's finalize and escape one at a time, and each link
through the router: 60 ms of a 100 ms page on a busy machine. Here each element is one
``Markup.format`` (markupsafe escapes every value given to it) and the links share one
prefix, which keeps the page's output the same.
"""

from __future__ import annotations

from markupsafe import Markup

from ._display import visible
from ._workflow_reads import Workflow

_EDGE = Markup(
    '<path class="{}" d="M{},{} C{},{} {},{} {},{}"><title>{} waits for {}</title></path>\n'
)
_NODE = Markup(
    '<a href="{href}" class="node" id="node-{id}">'
    '<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="4" class="node-{state}{this}"/>'
    '<text x="{tx}" y="{ty1}" class="task">{task}</text>'
    '<text x="{tx}" y="{ty2}" class="meta">{id} · {state}</text>'
    "<title>job {id}: {title}</title></a>\n"
)
_LISTED = Markup('<a href="{}">{}</a> {} {}')
_STATUS = Markup('<span class="status status-{0}">{0}</span>')
_PRUNED = Markup('<span class="note">pruned</span>')
#: Characters of a task's name a node shows; longer ones end in an ellipsis.
TASK_CHARS = 26


def _cut(text: str) -> str:
    """``text`` cut as the template's ``truncate`` did, its control characters made visible."""
    cut: str = visible(text if len(text) <= TASK_CHARS else text[: TASK_CHARS - 1] + "…")
    return cut


def svg_body(graph: Workflow, job_href: str) -> Markup:
    """The edges, then the nodes (drawn over them); ``job_href``: a job's URL without its id."""
    parts: list[str] = []
    for e in graph.edges:
        classes = "edge" + (" pending" if e.pending else "")
        classes += " runs-anyway" if e.on_failure == "run" else ""
        parts.append(
            _EDGE.format(
                classes, e.x1, e.y1, e.x1 + 30, e.y1, e.x2 - 30, e.y2, e.x2, e.y2,
                e.job_id, e.depends_on,
            )
        )  # fmt: skip
    for n in graph.nodes:
        state = n.status or "pruned"
        title = f"{n.task or 'pruned'}, {state}" + (f", queue {n.queue}" if n.queue else "")
        # What the template's finalize did to every value: control characters made visible.
        title = visible(title)
        parts.append(
            _NODE.format(
                href=job_href + str(n.id),
                id=n.id,
                x=n.x,
                y=n.y,
                w=graph.node_width,
                h=graph.node_height,
                state=visible(state),
                this=" this" if n.id == graph.job_id else "",
                tx=n.x + 8,
                ty1=n.y + 18,
                ty2=n.y + 36,
                task=_cut(n.task or "pruned job"),
                title=title,
            )
        )
    return Markup("").join(parts)


def layer_items(graph: Workflow, job_href: str) -> list[Markup]:
    """Each layer's jobs as one line: a link, the task and the status of each."""
    lines = []
    for layer in graph.layers:
        jobs = [
            _LISTED.format(
                job_href + str(n.id),
                n.id,
                visible(n.task or "-"),
                _STATUS.format(visible(n.status)) if n.status else _PRUNED,
            )
            for n in layer
        ]
        lines.append(Markup("; ").join(jobs))
    return lines
