"""Unit tests: fast, in-process, no subprocesses or network."""
