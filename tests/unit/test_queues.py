"""Queues: the CLI's concurrency per queue, without a database."""

from __future__ import annotations

import pytest

from sa_jobqueue.cli._values import queues as _queues
from sa_jobqueue.cli._worker import lanes as _lanes


def test_the_cli_reads_a_concurrency_per_queue() -> None:
    assert _lanes(_queues("a,b"), 4) == ["a", "b"]
    assert _lanes(_queues("emails=8,reports=1"), 4) == {"emails": 8, "reports": 1}
    assert _lanes(_queues("emails=8,default"), 4) == {"emails": 8, "default": 4}
    with pytest.raises(Exception, match="at least 1"):
        _queues("emails=0")
