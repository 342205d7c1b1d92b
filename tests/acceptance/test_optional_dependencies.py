"""Metrics and tracing cost nothing unless asked for, and say what to install when missing."""

from __future__ import annotations

from sqlalchemy.engine import URL

from tests.helpers.databases import url_string
from tests.unit.test_optional_dependencies import python


def test_metrics_without_prometheus_client_is_one_line_from_the_cli(database_url: URL) -> None:
    result = python(
        "import sys\n"
        "sys.modules['prometheus_client'] = None  # as if not installed\n"
        "from sa_jobqueue.cli import main\n"
        "sys.exit(main(['worker', 'tests.apps.observed:queue', '--burst', '--metrics-port', '0',"
        f" '--database-url', {url_string(database_url)!r}]))\n"
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "sa-jobqueue: sa_jobqueue's metrics need prometheus-client:"
        " pip install 'sa_jobqueue[metrics]'"
    ]
