"""What a type checker sees: mypy (strict) on the samples in tests/unit/typing_samples."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

SAMPLES = Path(__file__).parent / "typing_samples"


def mypy(sample: str, cache: Path) -> tuple[str, int]:
    out, err, status = api.run(
        ["--strict", "--cache-dir", str(cache), "--no-error-summary", str(SAMPLES / sample)]
    )
    return out + err, status


@pytest.mark.timeout(300)
def test_a_task_is_generic_in_its_handlers_payload_type(tmp_path: Path) -> None:
    output, status = mypy("typed_tasks.py", tmp_path)
    assert (output, status) == ("", 0)
