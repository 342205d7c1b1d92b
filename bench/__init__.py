"""Benchmark harness: sa_jobqueue next to its Python peers on one PostgreSQL (``bench/run``)."""
