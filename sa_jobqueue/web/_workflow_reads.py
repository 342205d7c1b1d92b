"""What the job page shows of a job's result and dependencies, the workflow view's graph, and
a workflow's own page (the jobs that carry its id).

Plain data, read in the caller's transaction like :mod:`._reads`. The graph is laid out here,
in Python, so that the page draws it as inline SVG without any script: each job in a column
by the longest path to it from a job that waits for nothing (its layer), the columns left to
right in the order the jobs run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy import Connection

from .._sql import dependencies as dependencies_sql
from .._sql import workflows as workflows_sql
from ..errors import UnknownWorkflowError
from ..models import STATUSES
from ..ops.workflows import WorkflowJob, WorkflowState, read_jobs, state_of, workflow_job
from ._reads import MAX_CHARS, now

#: The most dependencies, and dependents, the job page lists (each list says how many more).
SHOWN: Final = 50
#: The most edges counted each way: past it, the page says "over" this many.
COUNTED: Final = 10_000
#: The most jobs a workflow view draws: those nearest the job it was opened from, by the
#: number of edges between them; the view says when the workflow has more.
MOST_JOBS: Final = 200
#: The most edges drawn among them (a chord of 200 has 199).
MOST_EDGES: Final = 2_000

#: The graph's geometry, in SVG user units (CSS pixels).
NODE_WIDTH: Final = 190
NODE_HEIGHT: Final = 46
COLUMN_GAP: Final = 60
ROW_GAP: Final = 14
MARGIN: Final = 8


@dataclass(frozen=True)
class Neighbour:
    """A job at the other end of one of a job's edges."""

    id: int
    #: None when the job was pruned (its settled edge is deleted with the next pruning).
    task: str | None
    status: str | None
    #: What its ending dead or cancelled does to the waiting job: "cancel" or "run".
    on_failure: str
    #: The edge is not settled yet: the dependency has not ended.
    pending: bool


@dataclass(frozen=True)
class JobLinks:
    """A job's kept result and its edges, for its page."""

    #: The stored result as JSON text, cut to :data:`~._reads.MAX_CHARS`; None: none kept
    #: (its task keeps none, or it has not succeeded).
    result: str | None
    result_length: int | None
    waits_for: list[Neighbour]
    #: Up to :data:`COUNTED` + 1 (then: over COUNTED).
    waits_for_count: int
    waited_on_by: list[Neighbour]
    waited_on_by_count: int


def read_links(conn: Connection, job_id: int) -> JobLinks:
    """Job ``job_id``'s kept result and up to :data:`SHOWN` jobs each way, with the counts."""
    result = conn.execute(
        dependencies_sql.kept_result(), {"job_id": job_id, "max_chars": MAX_CHARS}
    ).one_or_none()
    params = {"job_id": job_id, "shown": SHOWN, "upto": COUNTED + 1}
    ups = [Neighbour(*row) for row in conn.execute(dependencies_sql.waits_for(), params)]
    downs = [Neighbour(*row) for row in conn.execute(dependencies_sql.waited_on_by(), params)]
    up_count, down_count = conn.execute(dependencies_sql.edge_counts(), params).one()
    return JobLinks(
        result=None if result is None else result.text,
        result_length=None if result is None else result.length,
        waits_for=ups,
        waits_for_count=up_count,
        waited_on_by=downs,
        waited_on_by_count=down_count,
    )


@dataclass(frozen=True)
class Node:
    """A job of the graph, where it is drawn."""

    id: int
    task: str | None
    queue: str | None
    status: str | None
    layer: int
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    """An arrow from a dependency to the job that waits for it, from its right side to the
    waiting job's left side."""

    depends_on: int
    job_id: int
    on_failure: str
    pending: bool
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class Workflow:
    """The workflow view: the jobs joined to one job by edges, laid out in layers."""

    as_of: datetime
    job_id: int
    nodes: list[Node]
    edges: list[Edge]
    #: The jobs of each layer, top to bottom.
    layers: list[list[Node]]
    #: More jobs are joined to it than :data:`MOST_JOBS`: the farthest are left out.
    cut: bool
    width: int
    height: int
    node_width: int = NODE_WIDTH
    node_height: int = NODE_HEIGHT


def read_workflow(conn: Connection, job_id: int) -> Workflow | None:
    """The graph around ``job_id``: up to :data:`MOST_JOBS` jobs nearest it; None without
    such a job (neither in the jobs table nor at the end of an edge)."""
    as_of = now(conn)
    walk = {"job_id": job_id, "most": MOST_JOBS + 1}
    ids: list[int] = [row[0] for row in conn.execute(dependencies_sql.connected_jobs(), walk)]
    cut = len(ids) > MOST_JOBS
    ids = ids[:MOST_JOBS]
    jobs = {row.id: row for row in conn.execute(dependencies_sql.graph_nodes(), {"job_ids": ids})}
    if job_id not in jobs and len(ids) == 1:
        return None
    among = {"job_ids": ids, "most": MOST_JOBS, "edges": MOST_EDGES}
    links = [tuple(row) for row in conn.execute(dependencies_sql.edges_among(), among)]
    layer = layers_of(ids, [(row[1], row[0]) for row in links])
    columns: dict[int, list[int]] = defaultdict(list)
    for node in ids:
        columns[layer[node]].append(node)
    parents: dict[int, list[int]] = defaultdict(list)
    for job, dependency, *_ in links:
        parents[job].append(dependency)
    row_of: dict[int, float] = {}
    for depth in sorted(columns):
        # Each job near the middle of what it waits for: fewer crossing arrows.
        column = sorted(
            columns[depth],
            key=lambda n: (_mean([row_of[p] for p in parents[n] if p in row_of]), n),
        )
        columns[depth] = column
        row_of.update((n, float(i)) for i, n in enumerate(column))
    nodes: dict[int, Node] = {}
    for depth, column in columns.items():
        for index, node in enumerate(column):
            found = jobs.get(node)
            nodes[node] = Node(
                id=node,
                task=None if found is None else found.task,
                queue=None if found is None else found.queue,
                status=None if found is None else found.status,
                layer=depth,
                x=MARGIN + depth * (NODE_WIDTH + COLUMN_GAP),
                y=MARGIN + index * (NODE_HEIGHT + ROW_GAP),
            )
    edges = [
        Edge(
            depends_on=dependency,
            job_id=job,
            on_failure=on_failure,
            pending=pending,
            x1=nodes[dependency].x + NODE_WIDTH,
            y1=nodes[dependency].y + NODE_HEIGHT // 2,
            x2=nodes[job].x,
            y2=nodes[job].y + NODE_HEIGHT // 2,
        )
        for job, dependency, on_failure, pending in links
    ]
    tallest = max((len(c) for c in columns.values()), default=1)
    return Workflow(
        as_of=as_of,
        job_id=job_id,
        nodes=[nodes[n] for n in ids],
        edges=edges,
        layers=[[nodes[n] for n in columns[d]] for d in sorted(columns)],
        cut=cut,
        width=2 * MARGIN + len(columns) * (NODE_WIDTH + COLUMN_GAP) - COLUMN_GAP,
        height=2 * MARGIN + tallest * (NODE_HEIGHT + ROW_GAP) - ROW_GAP,
    )


def layers_of(ids: list[int], arrows: list[tuple[int, int]]) -> dict[int, int]:
    """Each job's layer: 0 for one that waits for none of ``ids``, else one more than the
    deepest of those it waits for (the longest path to it). ``arrows``: (dependency, job).

    Edges cannot form a cycle (a job depends only on jobs that existed before it); should rows
    written some other way hold one, its jobs keep the layer they had reached.
    """
    waiting_on: dict[int, int] = dict.fromkeys(ids, 0)
    after: dict[int, list[int]] = defaultdict(list)
    for dependency, job in arrows:
        waiting_on[job] += 1
        after[dependency].append(job)
    layer = dict.fromkeys(ids, 0)
    ready = [n for n in ids if waiting_on[n] == 0]
    while ready:
        node = ready.pop()
        for job in after[node]:
            layer[job] = max(layer[job], layer[node] + 1)
            waiting_on[job] -= 1
            if waiting_on[job] == 0:
                ready.append(job)
    return layer


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


# -- a workflow's own page: the jobs that carry its id -----------------------------------------

#: The most jobs a workflow's page lists (lowest ids first); its counts cover them all.
PAGE_JOBS: Final = 500


@dataclass(frozen=True)
class WorkflowPage:
    """A workflow as its page shows it: up to :data:`PAGE_JOBS` jobs, and counts of all."""

    as_of: datetime
    id: int
    jobs: list[WorkflowJob]
    #: Jobs per status, in the order of a job's life, over the whole workflow.
    counts: dict[str, int]
    state: WorkflowState

    @property
    def total(self) -> int:
        """How many jobs the workflow has (the page lists the first :data:`PAGE_JOBS`)."""
        return sum(self.counts.values())


def read_workflow_page(conn: Connection, workflow_id: int) -> WorkflowPage | None:
    """Workflow ``workflow_id``'s page: its first jobs and its counts; None if no job carries
    that id. Two statements, both on the workflow index."""
    try:
        rows = read_jobs(conn, workflow_id, locked=False, most=PAGE_JOBS)
    except UnknownWorkflowError:
        return None
    counted: dict[str, int] = dict(
        conn.execute(workflows_sql.status_counts(), {"workflow_id": workflow_id}).all()
    )
    counts = {status: counted[status] for status in STATUSES if counted.get(status)}
    jobs = [workflow_job(row) for row in rows]
    return WorkflowPage(now(conn), workflow_id, jobs, counts, state_of(counts))
