"""A job's stored spec text, parsed once while it keeps being read (`spec_of`).

Why (issue 18: the head's CPU per job): the head reads a job's record several times in its
short life, and each read validated its spec's JSON again, ~25 us of pydantic (a Python
validator per field) for the same text: the cycle's starting jobs, the running jobs' read-back
after their start and after their launch record, the cycle's ending jobs. A trivial job's
record was parsed three times, and those parses were a twentieth of the head's CPU per job.

Keyed by the text itself, so a hit is exactly what parsing it again would give: a spec changed
by `gpucluster update` is new text, hence a new parse. Several records (and threads) may hold
the same JobSpec object, as an array's elements already share their first element's spec: no
caller mutates a record's spec (`job_out` redacts with `model_copy`, `merged_spec` builds a
new one). Bounded: at most MEMO_SIZE texts, the least recently read dropped first, so a head
at rest keeps well under a megabyte (a spec sent with the submitter's whole environment is a
few kilobytes).
"""

from __future__ import annotations

from functools import lru_cache

from gpucluster.models import JobSpec

MEMO_SIZE = 256


@lru_cache(maxsize=MEMO_SIZE)
def spec_of(text: str) -> JobSpec:
    """The JobSpec stored as `text` (validated as at any read: a bad text raises, and is not kept)."""
    return JobSpec.model_validate_json(text)
