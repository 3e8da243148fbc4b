"""Who may submit which priority class: the policy's `priority_grants`, checked at submit (403).

Why at submit: a class above normal goes first in line and preempts lower classes (critical is
never preempted), so it is a privilege the policy grants per team, role or user, like Slurm's
QOS tied to associations. The scheduler itself trusts the classes it is given.
"""

from __future__ import annotations

from gpucluster.auth.identity import Denied, Identity
from gpucluster.core.policy import Policy
from gpucluster.core.types import Priority


def check_priority(who: Identity, team: str, priority: str, policy: Policy, service: bool = False) -> None:
    """Denied (403) unless `who` may submit `priority` jobs (`service`: a service's replicas) to
    `team`; the message names the classes they may use and how an admin grants this one."""
    asked = Priority.parse(priority)
    role = who.role_in(team)
    if policy.may_use(asked, team, role, who.user, who.cluster_admin):
        return
    classes = policy.allowed_classes(team, role, who.user, who.cluster_admin)
    allowed = ", ".join(p.label for p in classes if service or p != Priority.SERVING)
    grant = policy.priority_grants.get(asked)
    holders = grant.describe() if grant is not None else "cluster admins only"
    raise Denied(
        f"priority: you ({who.user}) may not submit {asked.label} jobs to team {team} "
        f"({asked.label} is granted to {holders}); you may use: {allowed}. "
        f"A cluster admin grants it in the policy file: priority_grants: "
        f"{{{asked.label}: {{teams: [{team}]}}}} (or roles: [team-admin], or users: [{who.user}])"
    )


def serving_refusal(priority: str) -> str | None:
    """What to tell a plain job that asks for the serving class (a 422 on `priority`), or None.

    Why: serving is the class of service replicas (`gpucluster serve`). Every member may hold
    it by default because a replica preempts only checkpointed work (`preemption.
    serving_victims`) and answers requests; a batch job in it would go first in line with none
    of those bounds."""
    if Priority.parse(priority) != Priority.SERVING:
        return None
    return (
        "serving is the class of service replicas: run a model service with `gpucluster serve`, "
        "or submit this job as low, normal or high"
    )
