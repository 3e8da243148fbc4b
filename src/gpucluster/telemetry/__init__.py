"""GPU telemetry (issue 7): sample every node's GPUs, keep the samples, judge health, find idle
jobs and jobs over their memory share, and export Prometheus metrics.

  readings.py     what one sample of a node holds
  nvml.py         NVML source (real GPUs; a fake pynvml module drives it in tests)
  synthetic.py    virtual GPUs: the load jobs report, or a declared default
  attribution.py  GPU process pid -> job, from the executor's handles
  health.py       pure: readings -> problems (ECC, fatal XID, temperature)
  monitor.py      the sampling thread: samples -> store, health -> drain, idle / memory checks
  metrics.py      /metrics (Prometheus) and the scheduling loop's own timings
"""
