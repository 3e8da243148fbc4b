"""From an allocation to what a job's process sees: its environment and command."""
