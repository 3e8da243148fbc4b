"""The `gpucluster` command line."""
