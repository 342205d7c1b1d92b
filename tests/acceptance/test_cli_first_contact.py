"""The command line as a new user first meets it: what it says when something is wrong.

An app that does not import, a reader that stops reading (``| head``), options in either place
around the subcommand, ``--version``, Alembic's chatter, and a worker told to serve a queue no
task declares. The assertions are on exit status, output shape and state, not on wording.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue import cli
from tests.helpers.databases import url_string
from tests.helpers.job_states import add_job
from tests.helpers.processes import CLI, REPO_ROOT, run_cli, subprocess_env

# -- an app that fails to import ----------------------------------------------------------------


# -- a reader that stops reading: `sa-jobqueue ... | head -c 100` ------------------------------


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["jobs", "list", "--json"], id="jobs-list"),
        pytest.param(["stats", "--json"], id="stats"),
        pytest.param(["stats", "--json", "--watch", "5"], id="stats-watch"),
    ],
)
def test_output_into_a_closed_pipe_exits_quietly(
    database_url: URL, engine: sa.Engine, command: list[str]
) -> None:
    with engine.begin() as conn:
        for _ in range(3):
            add_job(conn)
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the command writes a byte
    try:
        result = subprocess.run(
            [
                *CLI,
                *command,
                "--database-url",
                url_string(database_url),
            ],
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(writer)
    assert result.stderr == ""
    assert result.returncode == cli.EXIT_BROKEN_PIPE


def test_a_reader_that_stops_early_ends_a_long_listing(
    database_url: URL, engine: sa.Engine
) -> None:
    with engine.begin() as conn:
        for _ in range(600):  # far more JSON than a pipe buffers
            add_job(conn, payload={"text": "x" * 200})
    proc = subprocess.Popen(
        [
            *CLI,
            "jobs",
            "list",
            "--json",
            "--limit",
            "600",
            "--database-url",
            url_string(database_url),
        ],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    head = proc.stdout.read(100)
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.stderr.close()
    status = proc.wait(60)
    assert len(head) == 100
    assert stderr == b""
    assert status == cli.EXIT_BROKEN_PIPE


# -- global options: before or after the subcommand ---------------------------------------------


def test_log_level_after_the_subcommand_runs(
    database_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(
        ["jobs", "list", "--log-level", "WARNING", "--database-url", url_string(database_url)]
    )
    assert status == 0, capsys.readouterr().err


# -- --version ------------------------------------------------------------------------------------


# -- Alembic's own INFO lines ----------------------------------------------------------------------


def test_migrate_prints_no_alembic_lines_by_default(empty_database_url: URL) -> None:
    url = url_string(empty_database_url)
    result = run_cli("migrate", "--database-url", url)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(result.stdout.strip().splitlines()) == 1

    again = run_cli("--log-level", "INFO", "migrate", "--database-url", url)
    assert again.returncode == 0, again.stderr
    assert "alembic" in again.stderr  # asked for: its records are there (logger names shown)


# -- a worker serving a queue no task declares -----------------------------------------------------
