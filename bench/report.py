"""The benchmark's report, computed from its raw result document (the JSON a run writes).

Everything printed comes from the document alone, so a committed raw result can be rendered
again (``bench/readme_table.py`` renders the docs' table from one). :func:`add_ratios` adds
to the document, per scenario and measure, the best peer configuration and each system's
ratios to it and to the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

Document = dict[str, Any]

#: Scenarios whose rows are drains: one line per measure, with CPU per job.
DRAINS = ("drain", "write", "history", "pinned", "backlog", "batch-write", "async", "scale")
#: The scale scenario's drains, as its measures name them.
SCALE_KINDS = ("noop", "write", "batch_write")

TITLES = {
    "enqueue": "1. single-row enqueue, one commit each",
    "bulk": "2. bulk enqueue, one batch call per transaction",
    "drain": "3. drain of pre-loaded no-op jobs",
    "write": "4. drain of jobs whose handler writes one row",
    "latency": "5. idle pickup latency (enqueue commit -> handler start)",
    "history": "6. drain with finished history in the table",
    "pinned": "7. sustained drain while a REPEATABLE READ snapshot is held open",
    "backlog": "8. drain out of a backlog of queued jobs, by backlog size",
    "batch-write": "9. drain of jobs written in batches, one multi-row INSERT per batch",
    "async": "async def handlers next to the same handlers written sync",
    "scale": "10. more worker processes against one server: drains by process count",
}

FOOTNOTES = {
    "enqueue": "sa_jobqueue: a Session per job, enqueue, commit (BEGIN, INSERT, COMMIT: three"
    " round trips); pgqueuer: Queries.enqueue on an autocommit connection (one statement, no"
    " transaction of the caller's to join); procrastinate: defer_async; chancy: push;"
    " reference = a raw psycopg INSERT + COMMIT into a minimal table (three round trips)."
    " Client CPU = the enqueuing process's CPU time (its event loop included), not the"
    " server's.",
    "bulk": "Each batch (--bulk-batch, default 1,000) is one transaction. sa_jobqueue:"
    " enqueue_many (by COPY from 200 jobs); procrastinate: batch_defer_async; pgqueuer:"
    " Queries.enqueue with lists; chancy: push_many(batch_size=batch); reference: INSERT ..."
    " SELECT unnest(array) + COMMIT into a minimal table.",
    "drain": "reference = hand-written loop: claim 100 with one UPDATE ... FOR UPDATE SKIP LOCKED"
    " ... RETURNING, mark them done with one UPDATE ... = ANY(ids), autocommit (the ceiling).",
    "write": "Not the same guarantee. sa_jobqueue's row is written through ctx.session and commits"
    " in the job's completion transaction (exactly once); so does the reference loop's (the"
    " batch's rows and its completion in one transaction). The peers' handlers write on a"
    " connection of their own, in a transaction apart from the job's completion, so a crash"
    " between the two repeats the write (at-least-once). They are compared all the same.",
    "latency": "Handler start = time.time() in the handler; enqueue = time.time() when the"
    " enqueuing COMMIT returned. One machine, one clock.",
    "history": "History inserted with one INSERT ... SELECT generate_series in each system's table"
    " of finished jobs, then VACUUM ANALYZE (PgQueuer deletes finished jobs: its history is"
    " pgqueuer_log rows). 'change' = rate with history / rate on the empty table - 1.",
    "pinned": "'slowdown' = no-snapshot rate / pinned rate. The snapshot is taken after the"
    " jobs are loaded and held until the drain ends: no dead row version can be vacuumed.",
    "async": "sa_jobqueue alone. noop: the handler records itself; write: it also inserts"
    " one row through ctx.session (sync) or ctx.async_session (async), committed with the"
    " job's completion; 1ms: it waits a millisecond, time.sleep(0.001) on its thread (sync)"
    " or await asyncio.sleep(0.001) on the event loop (async). The async handlers are a"
    " JobQueue of their own (bench.async_tasks). 'vs sync' = async rate / sync rate.",
    "backlog": "Each size: a fresh table, the backlog enqueued in one bulk call, ANALYZE, then"
    " the workers drain it whole if it holds no more than --backlog-drain jobs, else are"
    " stopped once that many have started and the jobs finished by then count. 'PG change' ="
    " PostgreSQL CPU per job / its value at the smallest backlog - 1: a queue whose per-job"
    " cost does not grow with the backlog stays near 0. Autovacuum's CPU (if on) is not counted.",
    "batch-write": "sa_jobqueue: a batch task (max_size 500) whose handler writes its batch's"
    " rows with one multi-row INSERT through ctx.session, committed with the batch's fenced"
    " completions (exactly once); reference: its write loop (claim 100, one INSERT, mark them"
    " done, one commit). No peer has batch handlers: PgQueuer's batch_size batches dequeue and"
    " acknowledgement, its handler still takes one job; procrastinate and Chancy document none.",
    "scale": "noop: no-op handlers; write: one row per job (as scenario 4); batch_write: one"
    " multi-row INSERT per batch where the system has batch handlers (sa_jobqueue's batch task"
    " of max_size 500, the reference loop's 100), not run for PgQueuer, whose handlers take"
    " one job (its write line is its best). 'PG"
    " us/job' at each count against the smallest shows what the server pays for more"
    " processes. Below the table: the backends' wait events, sampled from pg_stat_activity"
    " every 20 ms (average backends per sample), with the statement that held the lock of"
    " each backend waiting on one (pg_blocking_pids).",
}


def backlog_key(size: int) -> str:
    """The measure of a backlog drain: ``1k``, ``100k``, ``1M``."""
    if size >= 1_000_000 and size % 1_000_000 == 0:
        return f"{size // 1_000_000}M"
    if size >= 1_000 and size % 1_000 == 0:
        return f"{size // 1_000}k"
    return str(size)


@dataclass(frozen=True)
class Measure:
    key: str  # the key of the row's medians
    label: str
    unit: str = "jobs/s"  # or "ms", or "us" (client CPU per job)

    @property
    def lower_is_better(self) -> bool:
        return self.unit in ("ms", "us")


def measures(name: str, options: dict[str, Any]) -> list[Measure]:
    """What a scenario measures, in the order its table shows them."""
    if name in ("enqueue", "bulk"):
        return [Measure("jobs/s", "jobs/s"), Measure("cpu", "client CPU per job", "us")]
    if name in ("drain", "write", "batch-write"):
        procs = options["drain_procs" if name == "drain" else "write_procs"]
        return [Measure(f"{p}p", f"{p} process{'es' if p > 1 else ''}") for p in procs]
    if name == "latency":
        return [Measure(f"p{q}", f"p{q}", "ms") for q in (50, 95, 99)]
    if name == "history":
        return [Measure("empty", "empty"), Measure("history", f"{options['history']:,} rows")]
    if name == "pinned":
        return [Measure("free", "no snapshot"), Measure("pinned", "pinned")]
    if name == "backlog":
        return [Measure(backlog_key(b), f"{b:,} queued") for b in options["backlog"]]
    if name == "scale":
        return [
            Measure(f"{kind} {p}p", f"{kind}, {p} proc{'s' if p > 1 else ''}")
            for kind in SCALE_KINDS
            for p in options["scale_procs"]
        ]
    if name == "async":
        return [
            Measure(f"{handler} {side}", f"{handler}, {side}")
            for handler in ("noop", "write", "1ms")
            for side in ("sync", "async")
        ]
    raise KeyError(name)


def _value(row: dict[str, Any], key: str) -> float:
    value = row.get("medians", {}).get(key)
    return float("nan") if value is None else float(value)


def vs_sync(row: dict[str, Any], key: str) -> float | None:
    """An async handler's rate over its sync twin's in the async scenario (``key`` ends
    " async"), or None: a sync line, or a side that did not run."""
    if not key.endswith(" async"):
        return None
    sync, rate = _value(row, key.removesuffix(" async") + " sync"), _value(row, key)
    return rate / sync if sync and not math.isnan(sync + rate) else None


def _usable(row: dict[str, Any]) -> bool:
    return not row.get("error") and not row.get("failures")


def add_ratios(document: Document) -> None:
    """Add ``best_peer`` per scenario and measure, and ``ratios`` to every row."""
    systems = document["systems"]
    document["best_peer"] = {}
    for name, rows in document["scenarios"].items():
        best: dict[str, dict[str, Any]] = {}
        for m in measures(name, document["options"]):
            candidates = [
                (_value(r, m.key), r["system"])
                for r in rows
                if systems[r["system"]]["peer"] and _usable(r)
            ]
            candidates = [(v, k) for v, k in candidates if not math.isnan(v)]
            if candidates:
                value, key = (min if m.lower_is_better else max)(candidates)
                best[m.key] = {"system": key, "value": value}
        document["best_peer"][name] = best
        reference = next((r for r in rows if r["system"] == "reference" and _usable(r)), None)
        for row in rows:
            ratios: dict[str, dict[str, float | None]] = {}
            for m in measures(name, document["options"]):
                value = _value(row, m.key)
                top = best.get(m.key, {}).get("value")
                ref = _value(reference, m.key) if reference else float("nan")
                ratios[m.key] = {
                    "vs_best_peer": value / top if top and not math.isnan(value) else None,
                    "vs_reference": value / ref if ref and not math.isnan(ref) else None,
                }
            row["ratios"] = ratios


def fmt(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    if unit == "ms":
        return f"{value:.2f}"
    if unit in ("MiB", "us"):
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:,.0f}"


def _table(header: list[str], lines: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(
            c.ljust(w) if j == 0 else c.rjust(w)
            for j, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(header), "  " + "  ".join("-" * w for w in widths), *[line(r) for r in lines]]


def render_scenario(name: str, document: Document) -> str:
    rows = document["scenarios"][name]
    options = document["options"]
    ms = measures(name, options)
    best = document.get("best_peer", {}).get(name, {})
    labels = {k: v["label"] for k, v in document["systems"].items()}
    out = [f"{TITLES.get(name, name)}  {document['sizes'].get(name, '')}"]
    errors: list[str] = []
    notes: list[str] = []
    lines: list[list[str]] = []
    if name in DRAINS:
        header = ["system", "run", "jobs/s", "vs best peer", "vs loop", "worker us/job",
                  "PG us/job", "RSS MiB", "verified"]  # fmt: skip
        if name in ("history", "pinned", "backlog", "async"):
            header.insert(
                -1,
                {"history": "change", "pinned": "slowdown", "async": "vs sync"}.get(
                    name, "PG change"
                ),
            )
        for row in rows:
            label = labels[row["system"]]
            if row.get("error"):
                errors.append(f"  {label}: {row['error']}")
                continue
            for i, m in enumerate(ms):
                ratios = row.get("ratios", {}).get(m.key, {})
                cells = [
                    label if i == 0 else "",
                    m.label,
                    fmt(_value(row, m.key), m.unit),
                    fmt(ratios.get("vs_best_peer"), "x"),
                    fmt(ratios.get("vs_reference"), "x"),
                    fmt(_value(row, f"{m.key} worker cpu"), "us"),
                    fmt(_value(row, f"{m.key} db cpu"), "us"),
                    fmt(_value(row, f"{m.key} rss"), "MiB"),
                ]
                if name == "backlog":
                    first = _value(row, f"{ms[0].key} db cpu")
                    this = _value(row, f"{m.key} db cpu")
                    change = "-"
                    if i > 0 and first and not math.isnan(first + this):
                        change = f"{(this / first - 1) * 100:+.0f}%"
                    cells.append(change)
                elif name == "async":
                    cells.append(fmt(vs_sync(row, m.key), "x"))
                elif name in ("history", "pinned"):
                    first, this = _value(row, ms[0].key), _value(row, m.key)
                    change = "-"
                    if i > 0 and first and this and not math.isnan(first + this):
                        change = (
                            f"{(this / first - 1) * 100:+.0f}%"
                            if name == "history"
                            else f"{first / this:.2f}x"
                        )
                    cells.append(change)
                cells.append("FAILED" if row.get("failures") else "ok")
                lines.append(cells)
            notes += [f"   {label}: {n}" for n in row.get("notes", [])]
    else:
        header = ["system"]
        for m in ms:
            header += [f"{m.label} ({m.unit})" if m.label != m.unit else m.unit, "vs best peer"]
            if name in ("enqueue", "bulk"):
                header.append("vs reference")
        header.append("verified")
        for row in rows:
            label = labels[row["system"]]
            if row.get("error"):
                errors.append(f"  {label}: {row['error']}")
                continue
            cells = [label]
            for m in ms:
                ratios = row.get("ratios", {}).get(m.key, {})
                cells += [fmt(_value(row, m.key), m.unit), fmt(ratios.get("vs_best_peer"), "x")]
                if name in ("enqueue", "bulk"):
                    cells.append(fmt(ratios.get("vs_reference"), "x"))
            cells.append("FAILED" if row.get("failures") else "ok")
            lines.append(cells)
            notes += [f"   {label}: {n}" for n in row.get("notes", [])]
    if lines:
        out += _table(header, lines)
    out += errors + notes
    if best:
        named = ", ".join(
            f"{m.label}: {labels[best[m.key]['system']]}" for m in ms if m.key in best
        )
        out.append(f"  Best peer configuration per column: {named}.")
    if name in FOOTNOTES:
        out.append(f"  Note: {FOOTNOTES[name]}")
    if name == "scale":
        out += render_waits(rows, labels)
    return "\n".join(out)


def render_waits(rows: list[dict[str, Any]], labels: dict[str, str], top: int = 5) -> list[str]:
    """Each system's busiest states at the most processes of each drain: what its backends
    did (statement, CPU or wait event) and, for lock waits, which statement held the lock."""
    out = ["  Sampled backends at the most processes of each drain (average per sample):"]
    for row in rows:
        drains = [r for r in row.get("runs", []) if r.get("waits")]
        for kind in SCALE_KINDS:
            ran = [r for r in drains if r["measure"].startswith(f"{kind} ")]
            if not ran:
                continue
            last = max(ran, key=lambda r: int(r["procs"]))
            waits = last["waits"]
            out.append(f"   {labels[row['system']]}, {last['measure']}:")
            for statement, state, n in waits["states"][:top]:
                out.append(f"     {n:6.2f}  {state:<28} {statement}")
            for statement, blocker, n in waits["blocked_by"][:3]:
                out.append(f"     {n:6.2f}  blocked by: {blocker}  <- {statement}")
        out += render_statements(row, drains, labels)
    return out


def render_statements(
    row: dict[str, Any], drains: list[dict[str, Any]], labels: dict[str, str], top: int = 6
) -> list[str]:
    """Per drain, the statements the server ran most often (``pg_stat_statements``, where the
    server has it): calls per 1,000 jobs, rows per call and milliseconds per call. What a job
    costs in claims, completions and commits at each process count."""
    out: list[str] = []
    for r in drains:
        statements = r["waits"].get("statements") or []
        jobs = r.get("finished") or 0
        if not statements or not jobs:
            continue
        out.append(f"   {labels[row['system']]}, {r['measure']}: statements per 1,000 jobs")
        for text, calls, rows, ms in statements[:top]:
            out.append(
                f"     {calls * 1000 / jobs:8.1f} calls  {rows / calls:6.1f} rows/call"
                f"  {ms / calls:7.3f} ms/call  {text}"
            )
    return out


def render_info(document: Document) -> str:
    info = document["info"]
    settings = ", ".join(f"{k}={v}" for k, v in info["settings"].items())
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    load = info.get("load_average", {})
    lines = [
        f"Command: {document['command']}  (commit {document['git']['commit'][:12]}"
        f"{', uncommitted changes' if document['git']['dirty'] else ''})",
        f"Machine: {info['cores']} cores, {info['ram_gib']} GiB RAM, {info['cpu']};"
        f" {info['kernel']}; Python {info['python']}",
        f"Load average (1 min) at the start / end: {load.get('start', '-')} /"
        f" {load.get('end', '-')}",
        f"PostgreSQL {info['postgresql']} ({info['server']}): {settings}",
        f"Versions: {versions}",
        "Configurations:",
    ]
    for system in document["systems"].values():
        lines.append(f"  {system['label']}: {system['config']}")
    lines += [
        "Drains: workers start on an empty queue, run a few untimed warm-up jobs and are"
        " stopped (SIGSTOP) once idle; the jobs are loaded and the workers continued at once."
        " The clock runs from the first handler start to the moment no job is left unfinished"
        f"; a drain is cut after {document['options']['max_drain_seconds']:g}s and counts the"
        " jobs finished by then. CPU per job: user + system time from /proc over the drain,"
        " of the worker processes with their children (worker) and of the PostgreSQL backends"
        " serving them (PG), divided by the jobs finished.",
        "'vs best peer': ratio to the best procrastinate, PgQueuer or Chancy configuration in"
        " that column (for latency, >1 is slower); 'vs loop' / 'vs reference': ratio to the"
        " hand-written reference.",
    ]
    return "\n".join(lines)


def render(document: Document) -> str:
    parts = [render_info(document)]
    parts += [render_scenario(name, document) for name in document["scenarios"]]
    return "\n\n".join(parts)
