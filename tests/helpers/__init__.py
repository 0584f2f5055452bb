"""Helpers shared by the tests (import as `from helpers.X import ...`; tests/ is on pytest's pythonpath)."""
