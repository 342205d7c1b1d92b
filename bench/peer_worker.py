"""Run one worker process of a peer (or of the reference loop) through its own API.

python -m bench.peer_worker SYSTEM {noop,write}    # database URL in $BENCH_DSN
"""

from __future__ import annotations

import logging
import os
import sys

from bench.systems import SYSTEMS


def main() -> None:
    key, kind = sys.argv[1], sys.argv[2]
    if kind not in ("noop", "write", "batch_write"):
        raise SystemExit(f"unknown handler kind {kind!r}")
    logging.basicConfig(level=logging.WARNING)
    system = SYSTEMS[key]
    run_worker = getattr(system, "run_worker", None)
    if run_worker is None:
        raise SystemExit(f"{key} has no worker of ours (it uses its own CLI)")
    run_worker(os.environ["BENCH_DSN"], kind)


if __name__ == "__main__":
    main()
