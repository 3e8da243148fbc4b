"""What GPUs this machine has: NVML when a driver is present, else declared virtual GPUs."""
