"""A suite's cells as benchmark tests (default: the smoke suite); the test itself ships in bench/suite_cells.py."""
from bench.suite_cells import test_cell  # noqa: F401  (collected here for `pytest tests/`)
