"""Moved to ``bench.support.storage`` (bench/files makes its volumes with it, and a bench never imports from tests/);
kept so that branches written against this path still import."""

from bench.support.storage import account_volumes, storage_helper, storage_root_for_tests

__all__ = ["account_volumes", "storage_helper", "storage_root_for_tests"]
