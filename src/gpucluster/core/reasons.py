"""Why a job waits: named reasons, each with a sentence a user can act on."""

from __future__ import annotations

from enum import StrEnum


class WaitReason(StrEnum):
    RESOURCES = "resources"
    BEHIND_HIGHER_PRIORITY = "behind_higher_priority"

    def sentence(self, **facts: object) -> str:
        if self is WaitReason.RESOURCES:
            return (
                f"waiting for {facts['gpus']} free {facts['gpu_type'] or 'same-model'} GPU(s) "
                f"on one node; "
                f"{facts['free']} free now"
            )
        return f"waiting behind job {facts['blocker']}, which is first in line for GPUs"
