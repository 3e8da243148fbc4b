"""The trace formats the simulator reads (readers.py), named apart so the CLI can list them
without importing the readers."""

FORMATS = ("philly", "pollux", "tiresias", "alibaba2023", "native")
