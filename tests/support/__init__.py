"""Helpers the test folders share (imported as ``support.*``; tests/ is on sys.path through its conftest.py)."""
