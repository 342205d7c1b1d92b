"""What a type checker sees: mypy (strict) on the samples in tests/unit/typing_samples."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from mypy import api

SAMPLES = Path(__file__).parent / "typing_samples"


@pytest.mark.timeout(300)
def test_a_task_is_generic_in_its_payload_type_and_enqueue_checks_it(tmp_path: Path) -> None:
    sample = SAMPLES / "typed_tasks.py"
    # mypy raises the process's recursion limit for good; the tests that run after this one
    # in the same process (a payload too deep to decode, say) need the usual one.
    limit = sys.getrecursionlimit()
    try:
        out, err, _ = api.run(
            ["--strict", "--cache-dir", str(tmp_path), "--no-error-summary", str(sample)]
        )
    finally:
        sys.setrecursionlimit(limit)
    assert sys.getrecursionlimit() == limit
    reported = {int(m[1]) for m in re.finditer(r"^[^:\n]+:(\d+): error:", out, re.MULTILINE)}
    marked = {
        number
        for number, line in enumerate(sample.read_text().splitlines(), 1)
        if line.rstrip().endswith("# error") or "# error:" in line
    }
    assert err == ""
    assert marked, "the sample marks the lines mypy must refuse"
    assert reported == marked, out
