"""The trace-driven simulator: replay a workload through the real scheduler on a virtual clock.

Layout, one job per module:
  spec.py        the cluster spec YAML -> ClusterSpec (node groups, speeds, failure and checkpoint
                 models, trace fill rules), with file:line errors
  yamlspec.py    YAML with the line of every key, for those errors
  workload.py    TraceJob, the one in-memory form of a job every trace format is read into
  readers.py     philly, pollux, tiresias, alibaba2023 and native readers; malformed rows reported by line
  formats.py     the format names (for the CLI, without importing the readers)
  fill.py        the documented, seeded rules that fill what a trace lacks
  scheduling.py  the only door into gpucluster.core: policies, JobRequest/RunningJob, decide()
  runtime.py     run time on a GPU model, ring all-reduce slowdown, checkpoint timelines
  engine.py      the event loop (a heap of events, one decide() per timestamp)
  metrics.py     JCT, queueing delay, fairness, GPU-hours, cost and energy from a finished run
  report.py      metrics.json, report.html and the PNG plots
  synthetic.py   a seeded synthetic trace shaped like Philly, at any size
  run.py         what `gpucluster simulate` does: load, run each policy, report

See README.md in this folder for the file formats, the models and the metric definitions.
"""
