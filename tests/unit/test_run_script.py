"""``tests/run``: both pytest passes run whatever the first returns, and both results count;
the second, against the embedded server, runs the integration and migration tiers again.

The script runs in a copy of the checkout's layout whose ``.venv`` holds stand-ins: each tool
logs how it was called and exits as the test says, so the script's own logic is what is tested
(no install, no lint, no PostgreSQL).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "run"

#: A stand-in for .venv/bin/python: pip succeeds; pytest logs the database it was given and
#: its arguments, and exits with FAKE_EXTERNAL or FAKE_EMBEDDED (the pass against the given
#: URL, or the other).
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$2" = "pytest" ]; then
    shift 2
    if [ -n "${SA_JOBQUEUE_TEST_DATABASE_URL:-}" ]; then
        echo "external $SA_JOBQUEUE_TEST_DATABASE_URL $*" >> "$FAKE_LOG"; exit "$FAKE_EXTERNAL"
    fi
    echo "embedded $*" >> "$FAKE_LOG"; exit "$FAKE_EMBEDDED"
fi
exit 0
"""


def run_script(
    tmp_path: Path,
    external: int = 0,
    embedded: int = 0,
    args: tuple[str, ...] = (),
    url: str = "postgresql://somewhere/db",
) -> tuple[int, str, list[str]]:
    (tmp_path / "tests").mkdir()
    shutil.copy(SCRIPT, tmp_path / "tests" / "run")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in [
        ("python", FAKE_PYTHON),
        ("ruff", "#!/usr/bin/env bash\nexit 0\n"),
        ("mypy", "#!/usr/bin/env bash\nexit 0\n"),
        ("mkdocs", "#!/usr/bin/env bash\nexit 0\n"),
    ]:
        tool = bin_dir / name
        tool.write_text(body)
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "log"
    env = dict(os.environ)
    env.update(
        SA_JOBQUEUE_TEST_DATABASE_URL=url,
        FAKE_LOG=str(log),
        FAKE_EXTERNAL=str(external),
        FAKE_EMBEDDED=str(embedded),
    )
    done = subprocess.run(
        ["bash", str(tmp_path / "tests" / "run"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    passes = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout + done.stderr, passes


@pytest.mark.parametrize(
    ("external", "embedded", "failed"),
    [(0, 0, False), (1, 0, True), (0, 1, True), (1, 1, True), (2, 0, True)],
)
def test_both_pytest_passes_run_and_either_failure_fails_the_run(
    tmp_path: Path, external: int, embedded: int, failed: bool
) -> None:
    status, output, passes = run_script(tmp_path, external, embedded)
    assert passes == [
        "external postgresql://somewhere/db -n 3 --dist worksteal",
        "embedded -n 3 --dist worksteal -m integration or migrations",
    ], output
    assert (status != 0) == failed, output
    summary = output.strip().splitlines()[-2:]
    assert summary[0].startswith("== pytest against postgresql://somewhere/db: "), output
    embedded_label = "== pytest against an embedded PostgreSQL (the integration"
    assert summary[1].startswith(embedded_label), output
    assert summary[0].endswith("passed" if external == 0 else f"FAILED (exit {external})")
    assert summary[1].endswith("passed" if embedded == 0 else f"FAILED (exit {embedded})")


def test_pytest_arguments_go_to_both_passes_whole(tmp_path: Path) -> None:
    status, output, passes = run_script(tmp_path, args=("-q", "tests/unit"))
    assert status == 0, output
    assert passes == [
        "external postgresql://somewhere/db -n 3 --dist worksteal -q tests/unit",
        "embedded -n 3 --dist worksteal -q tests/unit",
    ]


def test_without_a_server_the_whole_suite_runs_against_the_embedded_one(tmp_path: Path) -> None:
    status, output, passes = run_script(tmp_path, url="")
    assert status == 0, output
    assert passes == ["embedded -n 3 --dist worksteal"], output
