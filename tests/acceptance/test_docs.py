"""The documentation runs: every Python sample of README.md and docs/**/*.md, and the CLI page.

How a page's samples are run (CONTRIBUTING.md tells writers the same):

* A fenced ```` ```python ```` block runs. Blocks in any other language (``sh``, ``console``,
  ``text``, ``ini``, ``json``) are shown, never run.
* A python block with ``<!-- not run: <why> -->`` on the line just before its fence is shown
  only (an Alembic ``env.py``, which only Alembic can run). The reason is required.
* A python block whose first line is a comment naming a file (``# myapp/jobs.py``) is that file
  of the sample project, written before anything runs. The project starts with the README's
  files (the Quickstart's ``myapp``), so every page can import them; a page's own files are
  added to it (and replace the README's of the same path).
* The page's other python blocks run in order, in one namespace, in a process of their own
  whose current directory is the project, after the tables of ``myapp.models`` are created in
  a fresh database with our schema installed.
* Every PostgreSQL URL written in a sample (``postgresql://app@localhost/app``) is replaced by
  that database's URL, and ``DATABASE_URL`` is set to it.
* Then the project's ``test_*.py`` files, if the page wrote any, run under pytest.

Fences start at the beginning of a line: an indented python block would go unrun, so it fails.

The CLI reference's ```` ```text ```` blocks marked ``<!-- cli-help: <command> -->`` must equal
``python -m sa_jobqueue <command> --help``; ``SA_JOBQUEUE_UPDATE_DOCS=1`` rewrites them. The
error tree in docs/reference/errors.md must equal the one drawn in sa_jobqueue/errors.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

import sa_jobqueue.errors
from tests.helpers.databases import url_string

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
CLI_PAGE = DOCS / "reference" / "cli.md"

FENCE = re.compile(r"^```(\w*)[^\n]*$")
NOT_RUN = re.compile(r"^<!-- not run: \S.* -->$")
FILE_LINE = re.compile(r"^# ([\w./-]+\.py)$")
# A PostgreSQL URL as the samples write one, inside quotes.
SAMPLE_URL = re.compile(r"postgresql(\+psycopg)?://[^\"'\s]+")
TIMEOUT = 120


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the line of the block's first code line, 1-based
    language: str
    code: str
    not_run: bool

    @property
    def file(self) -> str | None:
        """The project file this block is, if its first line names one."""
        first = self.code.splitlines()[0] if self.code else ""
        match = FILE_LINE.match(first)
        return match[1] if match else None

    @property
    def runs(self) -> bool:
        return self.language == "python" and not self.not_run

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end] != "```":
            end += 1
        assert end < len(lines), f"{page.relative_to(ROOT)}:{i + 1}: the fence is never closed"
        not_run = i > 0 and bool(NOT_RUN.match(lines[i - 1]))
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 2, match[1], code, not_run))
        i = end + 1
    return found


def runnable(page: Path) -> bool:
    return any(b.runs for b in blocks(page))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_samples_are_marked_explicitly(page: Path) -> None:
    """A python block the runner would miss, and a marker with no block, are mistakes."""
    lines = page.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        where = f"{page.relative_to(ROOT)}:{number}"
        assert not re.match(r"^\s+```", line), f"{where}: indent no fence (it would not run)"
        if line.startswith("<!-- not run"):
            assert NOT_RUN.match(line), f"{where}: write <!-- not run: <why> -->"
            following = lines[number] if number < len(lines) else ""
            assert following.startswith("```python"), f"{where}: a marker with no python block"
    for block in blocks(page):
        assert block.language, f"{block.where()}: give the block a language"


# -- running the samples ---------------------------------------------------------------------

RUNNER = """
import json, sys
from pathlib import Path

sys.path.insert(0, ".")
url = sys.argv[2]
if Path("myapp/models.py").exists():
    import sqlalchemy
    from myapp.models import Base

    engine = sqlalchemy.create_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
namespace = {"__name__": "__main__"}
for path, line, code in json.loads(Path(sys.argv[1]).read_text()):
    # Padded so that a traceback names the page's own line.
    exec(compile("\\n" * (line - 1) + code, path, "exec"), namespace)
"""


def with_url(code: str, url: str) -> str:
    return SAMPLE_URL.sub(url, code)


def run(args: list[str], cwd: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": url, "COLUMNS": "100"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [p for p in PAGES if runnable(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_page_samples_run(page: Path, database_url: URL, tmp_path: Path) -> None:
    url = url_string(database_url)
    project = tmp_path / "project"
    files: dict[str, str] = {}
    sources = blocks(README) + (blocks(page) if page != README else [])
    for block in sources:
        if block.runs and block.file:
            files[block.file] = block.code
    for name, code in files.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(with_url(code, url))
        for parent in path.relative_to(project).parents:
            if parent != Path(".") and not (project / parent / "__init__.py").exists():
                (project / parent / "__init__.py").write_text("")

    steps = [
        (str(b.page), b.line, with_url(b.code, url)) for b in blocks(page) if b.runs and not b.file
    ]
    (tmp_path / "blocks.json").write_text(json.dumps(steps))
    result = run([sys.executable, "-c", RUNNER, str(tmp_path / "blocks.json"), url], project, url)
    assert result.returncode == 0, result.stdout + result.stderr

    tests = sorted(
        b.file for b in blocks(page) if b.runs and b.file and Path(b.file).name.startswith("test_")
    )
    if tests:
        result = run(
            [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider", *tests],
            project,
            url,
        )
        assert result.returncode == 0, result.stdout + result.stderr


# -- the CLI reference is the CLI's own help ---------------------------------------------------

CLI_MARK = re.compile(r"^<!-- cli-help: ([\w -]*) -->$")


#: Prints, as one JSON object, each command's ``--help`` (the commands are its arguments, each
#: a space-separated string): the CLI's ``main`` run once per command in one interpreter, as
#: ``python -m sa_jobqueue <command> --help`` runs it, which exits 0 after the help.
HELPS_SCRIPT = """
import contextlib, io, json, sys
from sa_jobqueue.cli import main
helps = {}
for command in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            status = main([*command.split(), "--help"])
        except SystemExit as exc:
            status = exc.code
    if status not in (0, None):
        sys.exit(f"{command} --help exited with {status}")
    helps[command] = out.getvalue()
print(json.dumps(helps))
"""


def cli_helps(commands: list[str]) -> dict[str, str]:
    """Each command's ``--help`` at 100 columns, all out of one ``python`` process."""
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", HELPS_SCRIPT, *commands],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    helps: dict[str, str] = json.loads(result.stdout)
    return helps


def test_cli_reference_is_the_cli_help() -> None:
    lines = CLI_PAGE.read_text().splitlines()
    helps = cli_helps([m[1] for m in map(CLI_MARK.match, lines) if m])
    out: list[str] = []
    stale: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        match = CLI_MARK.match(lines[i])
        if not match:
            i += 1
            continue
        assert lines[i + 1] == "```text", f"cli.md:{i + 2}: a cli-help mark needs a text block"
        end = lines.index("```", i + 2)
        shown = "\n".join(lines[i + 2 : end]).rstrip()
        actual = helps[match[1]].rstrip()
        if shown != actual:
            stale.append(match[1] or "(no command)")
        out += ["```text", *actual.splitlines(), "```"]
        i = end + 1
    if stale and os.environ.get("SA_JOBQUEUE_UPDATE_DOCS") == "1":
        CLI_PAGE.write_text("\n".join(out) + "\n")
        stale = []
    assert not stale, (
        f"docs/reference/cli.md differs from the --help of: {', '.join(stale)}; "
        "rewrite it with SA_JOBQUEUE_UPDATE_DOCS=1"
    )


# -- the error tree is the one the errors module draws -----------------------------------------


def test_error_tree_is_the_errors_module_tree() -> None:
    drawn = re.search(r"::\n\n((?:    .*\n)+)", sa_jobqueue.errors.__doc__ or "")
    assert drawn, "sa_jobqueue/errors.py's docstring should draw the tree in a literal block"
    tree = "\n".join(line[4:] for line in drawn[1].rstrip("\n").splitlines())
    page = (DOCS / "reference" / "errors.md").read_text()
    shown = re.search(r"<!-- error-tree: .* -->\n```text\n(.*?)\n```", page, flags=re.S)
    assert shown, "docs/reference/errors.md should show the tree after its error-tree mark"
    assert shown[1] == tree, (
        "copy the tree from sa_jobqueue/errors.py into docs/reference/errors.md"
    )


def test_the_errors_page_names_every_error_class() -> None:
    public = {
        name
        for name, value in vars(sa_jobqueue.errors).items()
        if not name.startswith("_")
        and isinstance(value, type)
        and issubclass(value, sa_jobqueue.errors.JobQueueError)
    }
    page = (DOCS / "reference" / "errors.md").read_text()
    shown = re.search(r"<!-- error-tree: .* -->\n```text\n(.*?)\n```", page, flags=re.S)
    assert shown, "docs/reference/errors.md should show the tree after its error-tree mark"
    # Each line of the tree names one class: its first word after the branch drawing.
    named = {re.sub(r"^[\s│├└─]*", "", line).split()[0] for line in shown[1].splitlines()}
    assert sorted(public - named) == [], "draw these in the tree of sa_jobqueue/errors.py"
    assert sorted(named - public) == [], "the tree names classes sa_jobqueue.errors lacks"
