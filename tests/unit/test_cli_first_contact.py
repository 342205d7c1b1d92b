"""What a first-time user meets at the command line before any database is reached."""

from __future__ import annotations

import logging
import textwrap
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sa_jobqueue import JobQueue, Worker, cli
from sa_jobqueue import worker as worker_module
from sa_jobqueue.cli._arguments import build_parser as _parser
from sa_jobqueue.cli._arguments import parse_args as _parse
from sa_jobqueue.database import create_engine
from sa_jobqueue.errors import WorkerConfigError
from sa_jobqueue.ops import RateLimit
from tests.helpers.jobs import handler
from tests.helpers.processes import run_cli

#: A URL nothing listens on: the commands below fail or succeed before connecting.
NOWHERE = "postgresql://nobody@127.0.0.1:1/none"


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("sa-jobqueue: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def write_app(directory: Path, source: str, helper: str | None = None) -> str:
    """An app module (and a helper module it may import) with fresh names; its module name."""
    name = f"app_{uuid.uuid4().hex}"
    text = textwrap.dedent(source)
    if helper is not None:
        (directory / f"{name}_helper.py").write_text(textwrap.dedent(helper))
        text = text.replace("HELPER", f"{name}_helper")
    (directory / f"{name}.py").write_text(text)
    return name


def run_worker(app: str, capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, str]:
    capsys.readouterr()
    status = cli.main(["worker", f"{app}:queue", "--database-url", NOWHERE, *options])
    return status, capsys.readouterr().err


def subcommands(parser: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every runnable command path, e.g. ("jobs", "list")."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from subcommands(sub, (*path, name))
            return
    yield path


REQUIRED = {
    ("worker",): ["tests.apps.acceptance:queue"],
    ("jobs", "show"): ["1"],
    ("jobs", "cancel"): ["1"],
    ("jobs", "purge"): ["--status", "dead", "--older-than", "1d"],
    ("queues", "pause"): ["emails"],
    ("queues", "resume"): ["emails"],
    ("queues", "limit"): ["emails", "--clear"],
    **{("workflows", action): ["1"] for action in ("show", "cancel", "retry", "delete")},
}


@pytest.mark.parametrize(
    ("source", "helper", "where"),
    [
        pytest.param(
            """\
            from sa_jobqueue import JobQueue

            queue = JobQueue()
            raise RuntimeError("settings missing")
            """,
            None,
            ("app", 4),
            id="raises",
        ),
        pytest.param(
            """\
            from sa_jobqueue import JobQueue

            queue = JobQueue(
            """,
            None,
            ("app", 3),
            id="syntax-error",
        ),
        pytest.param(
            """\
            import os

            from sa_jobqueue import JobQueue

            SECRET = os.environ["SA_JOBQUEUE_TEST_NO_SUCH_VARIABLE"]
            queue = JobQueue()
            """,
            None,
            ("app", 5),  # the app's line, not the line in os.py that raised KeyError
            id="library-raises",
        ),
        pytest.param(
            """\
            import HELPER

            queue = HELPER.queue
            """,
            """\
            from sa_jobqueue import JobQueue

            queue = JobQueue()
            queue.enqueue_soon()
            """,
            ("helper", 4),  # the innermost line of the user's own code
            id="helper-raises",
        ),
        pytest.param(
            """\
            from sa_jobqueue import JobQueue

            queue = JobQueue()


            @queue.task(max_attempts=0)
            def send(ctx, payload):
                pass
            """,
            None,
            ("app", 6),  # the decorator's line, not sa_jobqueue's own
            id="our-error",
        ),
    ],
)
def test_an_app_that_fails_to_import_names_the_file_and_line(
    app_dir: Path,
    capsys: pytest.CaptureFixture[str],
    source: str,
    helper: str | None,
    where: tuple[str, int],
) -> None:
    name = write_app(app_dir, source, helper)
    status, err = run_worker(name, capsys)
    assert status == cli.EXIT_ERROR
    line = one_line(err)
    module, number = where
    path = f"{name}.py" if module == "app" else f"{name}_helper.py"
    assert f"({path}, line {number})" in line


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory the CLI imports apps from, as it would the current directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture
def alembic_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("alembic")
    level = logger.level
    yield logger
    logger.setLevel(level)


@pytest.fixture
def mail_queue() -> JobQueue:
    queue = JobQueue()
    queue.task(name="send", queue="emails")(handler)
    queue.task(name="report", queue="reports")(handler)
    return queue


@pytest.fixture
def unused_engine() -> Iterator[sa.Engine]:
    engine = create_engine(NOWHERE)  # a Worker connects only when it runs
    yield engine
    engine.dispose()


def test_an_app_that_fails_to_import_shows_the_traceback_at_debug(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = write_app(app_dir, 'raise RuntimeError("settings missing")\n')
    status, err = run_worker(name, capsys, "--log-level", "DEBUG")
    assert status == cli.EXIT_ERROR
    assert "Traceback" in err
    assert f'{name}.py", line 1' in err  # the traceback's own frame line
    assert err.strip().splitlines()[-1].startswith("sa-jobqueue: ")


def test_a_missing_app_module_is_one_line_without_a_location(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = run_worker("app_that_does_not_exist", capsys)
    assert status == cli.EXIT_ERROR
    assert ", line " not in one_line(err)  # no frame of the user's to point at


def test_every_command_takes_the_global_options_before_or_after_it() -> None:
    parser = _parser()
    commands = list(subcommands(parser))
    assert ("jobs", "list") in commands
    assert ("verify",) in commands
    for command in commands:
        rest = REQUIRED.get(command, [])
        before = parser.parse_args(
            ["--log-level", "DEBUG", "--log-format", "json", *command, *rest]
        )
        after = parser.parse_args([*command, *rest, "--log-level", "DEBUG", "--log-format", "json"])
        default = parser.parse_args([*command, *rest])
        for args in (before, after):
            assert (args.log_level, args.log_format) == ("DEBUG", "json"), command
        assert (default.log_level, default.log_format) == (None, "text"), command
        # Given in both places, the one after the subcommand wins.
        both = parser.parse_args(["--log-level", "ERROR", *command, *rest, "--log-level", "DEBUG"])
        assert both.log_level == "DEBUG"


def test_version_option() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stderr == ""
    assert result.stdout.split() == ["sa-jobqueue", version("sa_jobqueue")]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ([], logging.WARNING),
        (["--log-level", "WARNING"], logging.WARNING),
        (["--log-level", "INFO"], logging.INFO),
        (["--log-level", "DEBUG"], logging.DEBUG),
    ],
)
def test_alembic_logs_only_when_asked_for(
    alembic_logger: logging.Logger, options: list[str], expected: int
) -> None:
    cli.main([*options, "stats", "--database-url", NOWHERE])
    assert alembic_logger.level == expected  # its own, whatever the root logger's is


def test_undeclared_queues(mail_queue: JobQueue) -> None:
    assert worker_module.undeclared_queues(mail_queue, ["emails", "reports"]) == []
    assert worker_module.undeclared_queues(mail_queue, ["default", "emials"]) == [
        "emials"
    ]  # default exempt
    assert worker_module.undeclared_queues(mail_queue, ["emials", "reprots", "emails"]) == [
        "emials",
        "reprots",
    ]
    custom = JobQueue(default_queue="mail")
    assert worker_module.undeclared_queues(custom, ["mail", "default"]) == ["default"]


def test_worker_warns_about_a_queue_no_task_declares(
    mail_queue: JobQueue, unused_engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="sa_jobqueue.worker"):
        Worker(mail_queue, unused_engine, queues=["default", "emials"])
        Worker(mail_queue, unused_engine, queues={"emails": 2, "reports": 1})
        Worker(mail_queue, unused_engine)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "emials" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ([], "say what to change: --concurrency N, --rate N/PERIOD"),
        (["--clear", "--rate", "5/s"], "--clear removes every limit: give it alone"),
        (["--clear", "--no-concurrency"], "--clear removes every limit: give it alone"),
        (["--per-key", "1"], "--key FIELD goes with --per-key N or --key-rate N/PERIOD"),
        (["--key-rate", "5/s"], "--key FIELD goes with --per-key N or --key-rate N/PERIOD"),
        (["--key", "customer_id", "--rate", "5/s"], "--key FIELD goes with --per-key N or"),
        (["--key-rate", "5"], "argument --key-rate: not a rate: '5'"),
        (["--key-rate", "5/s", "--no-key-rate"], "not allowed with argument --key-rate"),
        (["--concurrency", "0"], "argument --concurrency: a cap must be from 1 to 2147483647"),
        (["--concurrency", "-3"], "argument --concurrency: a cap must be from 1"),
        (["--concurrency", "2147483648"], "argument --concurrency: a cap must be from 1"),
        (["--concurrency", "three"], "argument --concurrency: not a whole number: 'three'"),
        (["--rate", "50"], "argument --rate: not a rate: '50' (N/PERIOD, e.g. 50/s"),
        (["--rate", "0/s"], "argument --rate: a rate's count must be from 1"),
        (["--rate", "5/0s"], "argument --rate: a rate's period must be 1 ms or longer"),
        (["--rate", "5/fortnight"], "argument --rate: not a rate: '5/fortnight'"),
        (["--rate", "5/s", "--no-rate"], "argument --no-rate: not allowed with argument --rate"),
        (["--concurrency", "2", "--no-concurrency"], "not allowed with argument --concurrency"),
    ],
)
def test_queues_limit_usage_errors_exit_2_before_connecting(
    capsys: pytest.CaptureFixture[str], options: list[str], says: str
) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(["queues", "limit", "emails", *options, "--database-url", NOWHERE])
    assert exited.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: sa-jobqueue queues limit"), err
    assert err.strip().splitlines()[-1].startswith("sa-jobqueue queues limit: error: ")
    assert says in err
    assert "Traceback" not in err


def test_queues_limit_options_parse_as_the_ops_api_reads_them() -> None:
    args = _parse(["queues", "limit", "emails", "--concurrency", "3", "--rate", "10/5m"])
    assert (args.name, args.concurrency, args.rate) == ("emails", 3, RateLimit.parse("10/5m"))
    assert (args.no_concurrency, args.no_rate, args.clear) == (False, False, False)
    args = _parse(["queues", "limit", "emails", "--no-rate"])
    assert (args.concurrency, args.rate, args.no_rate) == (None, None, True)


def test_many_undeclared_queues_give_one_warning_line_and_patterns_none(
    mail_queue: JobQueue, unused_engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    tenants = [f"tenant-{n}" for n in range(10_000)]
    with caplog.at_level(logging.INFO, logger="sa_jobqueue.worker"):
        Worker(mail_queue, unused_engine, queues=tenants)
        Worker(mail_queue, unused_engine, queues=["tenant-*", "*"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "10000 queues (tenant-0, tenant-1" in warnings[0]


@pytest.mark.parametrize("bad", ["tenant-[1]", "*%", "", "-x", "a" * 65, "tenant,*"])
def test_a_pattern_is_a_queue_name_with_wildcards_or_refused(
    mail_queue: JobQueue, unused_engine: sa.Engine, bad: str
) -> None:
    with pytest.raises(WorkerConfigError, match="invalid queue"):
        Worker(mail_queue, unused_engine, queues=[bad])


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--processes", "2", "--health-port", "8081"], "does not go with --processes"),
        (["--max-jobs-per-child", "10"], "need --processes"),
        (["--processes", "0"], "--processes must be at least 1"),
    ],
)
def test_supervisor_usage_errors_exit_2_before_connecting(
    capsys: pytest.CaptureFixture[str], options: list[str], says: str
) -> None:
    capsys.readouterr()
    status = cli.main(
        ["worker", "tests.apps.acceptance:queue", *options, "--database-url", NOWHERE]
    )
    assert status == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert says in one_line(err)
