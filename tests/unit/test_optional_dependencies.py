"""Optional dependencies are loaded only by the modules that need them (no database)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.processes import REPO_ROOT, subprocess_env

OPTIONAL = ("prometheus_client", "opentelemetry")


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_importing_the_package_the_worker_and_the_cli_loads_neither() -> None:
    result = python(
        "import sys\n"
        "import sa_jobqueue, sa_jobqueue.worker, sa_jobqueue.cli\n"
        "import sa_jobqueue.observability, sa_jobqueue.observability.logs\n"
        "sa_jobqueue.JobQueue()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r}))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_modules_that_need_them_load_them() -> None:
    result = python(
        "import sys\n"
        "import sa_jobqueue.observability.metrics, sa_jobqueue.observability.tracing\n"
        f"print(all(m in sys.modules for m in {OPTIONAL!r}))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_tracing_without_opentelemetry_says_what_to_install() -> None:
    result = python(
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if not installed\n"
        "from sa_jobqueue import JobQueue\n"
        "JobQueue(tracing=True)\n"
    )
    assert result.returncode != 0
    assert "pip install 'sa_jobqueue[tracing]'" in result.stderr


WEB = ("starlette", "jinja2", "uvicorn", "multipart", "python_multipart")


def test_importing_the_package_the_worker_and_the_cli_loads_no_web_dependency() -> None:
    result = python(
        "import sys\n"
        "import sa_jobqueue, sa_jobqueue.worker, sa_jobqueue.cli, sa_jobqueue.ops\n"
        "from sa_jobqueue.cli._arguments import build_parser\n"
        "build_parser().parse_args(['web', '--port', '0'])\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {WEB!r}))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_dashboard_loads_its_dependencies() -> None:
    result = python(
        "import sys\n"
        "import sa_jobqueue.web\n"
        "print(all(m in sys.modules for m in ('starlette', 'jinja2')))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_the_dashboard_without_its_extra_says_what_to_install() -> None:
    result = python(
        "import sys\n"
        "sys.modules['starlette'] = None  # as if not installed\n"
        "import sa_jobqueue.web\n"
    )
    assert result.returncode != 0
    assert "pip install 'sa_jobqueue[web]'" in result.stderr


def test_the_web_command_without_its_extra_is_one_line() -> None:
    result = python(
        "import sys\n"
        "sys.modules['starlette'] = None  # as if not installed\n"
        "from sa_jobqueue.cli import main\n"
        "sys.exit(main(['web', '--database-url', 'postgresql://nobody@127.0.0.1:9/none']))\n"
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "sa-jobqueue: sa-jobqueue web needs starlette: pip install 'sa_jobqueue[web]'"
    ]


def test_untyped_tasks_do_not_load_pydantic() -> None:
    result = python(
        "import sys\n"
        "from typing import Any\n"
        "from sa_jobqueue import JobContext, JobQueue\n"
        "from sa_jobqueue.testing import run_task\n"
        "queue = JobQueue()\n"
        "@queue.task\n"
        "def plain(ctx: JobContext, payload: dict[str, Any]) -> int:\n"
        "    return len(payload)\n"
        "print(run_task(plain, {'a': 1}), 'pydantic' in sys.modules)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 False"


def test_a_typed_payload_without_pydantic_is_refused_at_declaration() -> None:
    result = python(
        "import sys\n"
        "sys.modules['pydantic'] = None  # as if not installed\n"
        "from dataclasses import dataclass\n"
        "from typing import Any\n"
        "from typing_extensions import TypedDict\n"
        "from sa_jobqueue import JobContext, JobQueue\n"
        "from sa_jobqueue.errors import TaskDefinitionError\n"
        "from sa_jobqueue.testing import run_task\n"
        "@dataclass\n"
        "class Order:\n"
        "    order_id: int\n"
        "class Mail(TypedDict):\n"
        "    to: str\n"
        "queue = JobQueue()\n"
        "def ship(ctx: JobContext, payload: Order) -> None: ...\n"
        "def mail(ctx: JobContext, payload: Mail) -> None: ...\n"
        "for handler in (ship, mail):\n"
        "    try:\n"
        "        queue.task(handler)\n"
        "    except TaskDefinitionError as exc:\n"
        "        print(exc)\n"
        "@queue.task\n"
        "def plain(ctx: JobContext, payload: dict[str, Any]) -> int:\n"
        "    return payload['order_id']\n"
        "print(run_task(plain, {'order_id': 7}))\n"
    )
    assert result.returncode == 0, result.stderr
    why = (
        "is checked and rebuilt by Pydantic, which is not installed:"
        " pip install 'sa_jobqueue[pydantic]', or annotate the payload as dict[str, Any] or Any"
    )
    assert result.stdout.strip().splitlines() == [
        f"task 'ship': its payload type Order {why}",
        f"task 'mail': its payload type Mail {why}",
        "7",
    ]
