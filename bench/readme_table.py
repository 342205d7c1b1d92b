"""Render the docs' Performance table from one committed raw result of a full ``bench/run``.

    python bench/readme_table.py bench/runs/DATE-HOST.json   # rewrite the table from it
    python bench/readme_table.py --check                     # exit 1 if a table is stale

The table lives between two markers in docs/explanation/performance.md (and in README.md, if
it holds them too); the opening marker names the raw result it was rendered from:

    <!-- bench-table: bench/runs/DATE-HOST.json -->
    ...
    <!-- /bench-table -->

Every figure in it comes from that file, so the table can be rendered again and a test can
check that it still is what the file says. A run that was not a full one (``--quick``, a
subset, other sizes) is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

from bench import report  # noqa: E402

#: The files whose tables this script keeps (those holding the markers).
PAGES = (ROOT / "docs" / "explanation" / "performance.md", ROOT / "README.md")
BLOCK = re.compile(
    r"<!-- bench-table: (?P<source>\S+) -->\n(?P<body>.*?)<!-- /bench-table -->\n", re.S
)
#: What the block holds before any full run has been published.
NO_RUN = "none"
PLACEHOLDER = (
    "No full run of this benchmark has been published yet: `bench/run --publish` writes one to"
    " `bench/runs/`, and `bench/.venv/bin/python bench/readme_table.py bench/runs/FILE.json`"
    " renders this table from it.\n"
)


class NotAFullRun(ValueError):
    """The raw result is not that of a full run, so it cannot feed the docs."""


def _rate(value: float | None, unit: str = "jobs/s") -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.2f} ms" if unit == "ms" else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}\N{MULTIPLICATION SIGN}"


def _us(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.0f}"


def _rows(document: report.Document, name: str) -> dict[str, dict[str, Any]]:
    return {r["system"]: r for r in document["scenarios"].get(name, []) if not r.get("error")}


#: Per scenario, the other sa_jobqueue configurations the table shows a line for, when the
#: run measured them: the writing drain with fewer handler threads (see bench/bench.py).
VARIANTS: dict[str, dict[str, str]] = {"write": {"sa_jobqueue_c2": "`--concurrency 2`"}}


def _median(row: dict[str, Any] | None, key: str) -> float:
    if row is None:
        return float("nan")
    value = row.get("medians", {}).get(key)
    return float("nan") if value is None else float(value)


def _change(name: str, row: dict[str, Any] | None, first: str, this: str) -> str:
    """For the second line of history and pinned: the change from the first line; for an
    async handler's line: its rate against its sync twin's."""
    if name == "async":
        ratio = None if row is None else report.vs_sync(row, this)
        return "" if ratio is None else f" ({ratio:.2f}\N{MULTIPLICATION SIGN} sync)"
    if name not in ("history", "pinned") or first == this:
        return ""
    before, after = _median(row, first), _median(row, this)
    if math.isnan(before + after) or not before or not after:
        return ""
    if name == "history":
        return f" ({(after / before - 1) * 100:+.0f}%)"
    return f" (slowdown {before / after:.2f}\N{MULTIPLICATION SIGN})"


def _line(
    document: report.Document,
    name: str,
    m: report.Measure,
    title: str,
    ours: str = "sa_jobqueue",
) -> str:
    """The table's line for one measure; ``ours``: the sa_jobqueue configuration it shows."""
    rows = _rows(document, name)
    sa, ref = rows.get(ours), rows.get("reference")
    best = document["best_peer"].get(name, {}).get(m.key)
    peer = rows.get(best["system"]) if best else None
    peer_label = document["systems"][best["system"]]["label"] if best else "-"
    ratios = (sa or {}).get("ratios", {}).get(m.key, {})
    first = report.measures(name, document["options"])[0].key

    def figure(row: dict[str, Any] | None) -> str:
        return _rate(_median(row, m.key), m.unit) + _change(name, row, first, m.key)

    cells = [
        title,
        figure(sa),
        f"{peer_label}: {figure(peer)}" if best else "-",
        figure(ref),
        _ratio(ratios.get("vs_best_peer")),
        _ratio(ratios.get("vs_reference")),
    ]
    if name in report.DRAINS:
        for kind in ("worker", "db"):
            cells.append(
                " / ".join(_us(_median(r, f"{m.key} {kind} cpu")) for r in (sa, peer, ref))
            )
    else:
        cells += ["", ""]
    return "| " + " | ".join(cells) + " |"


def render_table(document: report.Document, source: str) -> str:
    """The Markdown block (caption and table) for one full run's raw result."""
    if not document.get("full_run"):
        raise NotAFullRun(f"{source} is not a full run ({document.get('command')})")
    if "best_peer" not in document:
        report.add_ratios(document)
    options, info = document["options"], document["info"]
    settings = ", ".join(f"`{k}={v}`" for k, v in info["settings"].items())
    git = document["git"]
    lines = [
        f"From `{source}` (`{document['command']}`, commit"
        f" `{git['commit'][:12]}`{', with uncommitted changes' if git['dirty'] else ''},"
        f" {document['started'][:10]}, {document['minutes']:.0f} minutes): {info['cores']}"
        f" cores ({info['cpu']}), PostgreSQL {info['postgresql']} on the same machine"
        f" ({settings}); load average {info['load_average'].get('start')} at the start,"
        f" {info['load_average'].get('end')} at the end. Each figure is the median of"
        f" {options['repeat']}; jobs/s unless noted. CPU is µs per job from /proc, of the"
        " worker processes and of the PostgreSQL backends serving them, for sa_jobqueue /"
        " the best peer configuration / the reference.",
        "",
        "| scenario | sa_jobqueue | best peer configuration | reference | ÷ best peer"
        " | ÷ reference | worker CPU µs/job | PostgreSQL CPU µs/job |",
        "|---|---|---|---|---|---|---|---|",
    ]
    titles = {
        "enqueue": lambda m: (
            f"single-row enqueue, a commit each ({options['single']:,})"
            + (", client CPU µs per job" if m.key == "cpu" else "")
        ),
        "bulk": lambda m: (
            f"bulk enqueue ({options['bulk']:,}, {options['bulk_batch']:,} per transaction)"
            + (", client CPU µs per job" if m.key == "cpu" else "")
        ),
        "drain": lambda m: f"drain {options['drain']:,} no-op jobs, {m.label}",
        "write": lambda m: f"drain {options['drain']:,} jobs writing one row, {m.label}",
        "batch-write": lambda m: f"drain {options['drain']:,} jobs written in batches, {m.label}",
        "latency": lambda m: f"idle pickup latency {m.label}",
        "history": lambda m: (
            f"drain {options['history_drain']:,} jobs, "
            + ("empty table" if m.key == "empty" else f"over {options['history']:,} finished rows")
        ),
        "pinned": lambda m: (
            f"drain {options['pinned']:,} jobs"
            + (", a REPEATABLE READ snapshot held" if m.key == "pinned" else "")
        ),
        "backlog": lambda m: f"drain out of a backlog, {options['procs']} processes, {m.label}",
        "async": lambda m: (
            f"drain {options['drain']:,} jobs, 1 process, {options['async_concurrency']} at once:"
            f" {m.label}"
        ),
    }
    for name in document["scenarios"]:
        for m in report.measures(name, options):
            title = titles.get(name, lambda m, name=name: f"{name} {m.label}")(m)
            lines.append(_line(document, name, m, title))
            for key, label in VARIANTS.get(name, {}).items():
                if key in _rows(document, name):
                    lines.append(_line(document, name, m, f"{title}, {label}", ours=key))
    lines += [
        "",
        "Writing drains: sa_jobqueue's row commits with the job's completion (exactly once),"
        " as the reference loop's does; the peers' handlers write in a transaction apart from"
        " the completion (at-least-once). The configurations, each run's raw figures and the"
        " full tables are in the raw result.",
    ]
    return "\n".join(lines) + "\n"


def render_block(source: str, root: Path = ROOT) -> str:
    if source == NO_RUN:
        body = PLACEHOLDER
    else:
        document = json.loads((root / source).read_text())
        body = render_table(document, source)
    return f"<!-- bench-table: {source} -->\n{body}<!-- /bench-table -->\n"


def stale(page: Path, root: Path = ROOT) -> list[str]:
    """The sources of ``page``'s tables that no longer render to what it holds."""
    text = page.read_text()
    return [
        m["source"] for m in BLOCK.finditer(text) if render_block(m["source"], root) != m.group(0)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/readme_table.py", description=__doc__.split("\n")[0])
    p.add_argument("source", nargs="?", help="a raw result under bench/runs/")
    p.add_argument("--check", action="store_true", help="only check that the tables are current")
    args = p.parse_args(argv)
    pages = [page for page in PAGES if page.exists() and BLOCK.search(page.read_text())]
    if not pages:
        p.error("no page holds a <!-- bench-table: ... --> marker")
    if args.check:
        problems = [f"{page.relative_to(ROOT)}: {s}" for page in pages for s in stale(page)]
        for problem in problems:
            print(f"stale table: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if args.source is None:
        p.error("name a raw result (bench/runs/FILE.json), or --check")
    source = Path(args.source).resolve().relative_to(ROOT).as_posix()
    try:
        block = render_block(source)
    except NotAFullRun as exc:
        p.error(str(exc))
    for page in pages:
        page.write_text(BLOCK.sub(lambda _: block, page.read_text(), count=1))
        print(f"{page.relative_to(ROOT)}: table from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
