"""Usage over time (GET /v1/usage/series): exact buckets on hand-computed cases, and who sees what.

The dashboard's per-team charts read this; a bucket must hold exactly the part of each attempt
accrued inside it, and a group's buckets must add up to its row of /v1/usage over the window.
"""

from __future__ import annotations

import pytest

from gpucluster.head.usage import report, series
from gpucluster.store.accounting import UsageRow

from .authkit import World

H = 3600.0
DAY0 = 20_000 * 86400.0  # a UTC midnight: hour buckets are aligned on it


def _row(job_id: int, team: str, start: float, end: float, gpus: float, price: float, watts: float) -> UsageRow:
    gpu_s = gpus * (end - start)
    return UsageRow(
        job_id=job_id, attempt=1, team=team, owner=None, gpu_model="H100", gpus=gpus, allocation=None,
        started_at=start, accrued_until=end, gpu_seconds=gpu_s, cost=gpu_s / H * price, energy_j=gpu_s * watts,
    )  # fmt: skip


def test_buckets_hold_exactly_the_part_of_each_attempt_inside_them() -> None:
    rows = [
        # vision: 1 GPU from 10:00 to 12:00 at 3.60/GPU-hour, 500 W: 2 GPU-h, 7.20, 1 kWh in all
        _row(1, "vision", DAY0 + 10 * H, DAY0 + 12 * H, 1, 3.60, 500),
        # nlp: 2 GPUs from 11:30 to 12:30 at 1.80, no telemetry: 2 GPU-h, 3.60
        _row(2, "nlp", DAY0 + 11.5 * H, DAY0 + 12.5 * H, 2, 1.80, 0),
        # outside the window: counts nowhere
        _row(3, "nlp", DAY0 + 8 * H, DAY0 + 9 * H, 8, 1.80, 0),
    ]
    since, until = DAY0 + 10.5 * H, DAY0 + 13 * H
    out = series(rows, "team", since, until, H)
    # Hour buckets aligned on the hour, the first clipped to since: 10:30, 11:00, 12:00 (to 13:00).
    assert out.buckets == [since, DAY0 + 11 * H, DAY0 + 12 * H]
    assert [s.key for s in out.series] == ["vision", "nlp"]  # largest cost first
    vision, nlp = out.series
    # vision's 10:30-11:00 is a quarter of its attempt, 11:00-12:00 a half, nothing after 12:00.
    assert vision.gpu_hours == pytest.approx([0.5, 1.0, 0.0])
    assert vision.cost == pytest.approx([1.80, 3.60, 0.0])
    assert vision.energy_kwh == pytest.approx([0.25, 0.5, 0.0])
    # nlp's 11:30-12:00 and 12:00-12:30 are half each: 1 GPU-hour and 1.80 in each.
    assert nlp.gpu_hours == pytest.approx([0.0, 1.0, 1.0])
    assert nlp.cost == pytest.approx([0.0, 1.80, 1.80])
    assert nlp.energy_kwh == [0.0, 0.0, 0.0]
    # The buckets add up to the report's rows over the same window.
    rep = {r.key: r for r in report(rows, "team", since, until).rows}
    for s in out.series:
        assert sum(s.cost) == pytest.approx(rep[s.key].cost)
        assert sum(s.gpu_hours) == pytest.approx(rep[s.key].gpu_hours)


def test_day_buckets_are_utc_days_and_too_many_buckets_are_refused() -> None:
    rows = [_row(1, "vision", DAY0 - 6 * H, DAY0 + 18 * H, 1, 1.0, 0)]  # 18:00 one day to 18:00 the next
    out = series(rows, "team", DAY0 - 12 * H, DAY0 + 24 * H, 86400.0)
    assert out.buckets == [DAY0 - 12 * H, DAY0]
    assert out.series[0].gpu_hours == pytest.approx([6.0, 18.0])
    with pytest.raises(ValueError, match="at most 1000"):
        series(rows, "team", DAY0, DAY0 + 30 * 86400, 60.0)


def test_api_shows_members_their_teams_only_and_refuses_bad_requests(world: World) -> None:
    # The world's clock is at 1000 s; both teams used 1 GPU from 300 s to 900 s at 3.60.
    world.cluster.head.accounting.usage.save(
        [_row(901, "vision", 300, 900, 1, 3.60, 0), _row(902, "nlp", 300, 900, 1, 3.60, 0)], {}
    )
    params = {"since": "1970-01-01", "step": "10m"}

    def keys(who: str) -> list[str]:
        r = world.app.get("/v1/usage/series", params=params, headers=world.as_(who))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["buckets"] == [0, 600] and body["until"] == 1000 and body["step"] == 600
        for s in body["series"]:  # 300-600 s and 600-900 s: half the attempt each
            assert s["cost"] == pytest.approx([0.30, 0.30]) and s["gpu_hours"] == pytest.approx([1 / 12, 1 / 12])
        return sorted(s["key"] for s in body["series"])

    assert keys("alice") == ["vision"]
    assert keys("bob") == ["nlp"]
    assert keys("root") == ["nlp", "vision"]

    def refused(**asked: str) -> str:
        r = world.app.get("/v1/usage/series", params=asked, headers=world.as_("root"))
        assert r.status_code == 422, r.text
        return str(r.json()["error"])

    assert refused(since="all").startswith("since: a series needs a start")
    assert refused(step="30s") == "step: must be at least 1m"
    assert refused(step="often").startswith("step: cannot read 'often'")
    assert "at most 1000" in refused(since="30d", step="1m")
    assert refused(since="1970-01-01", until="1970-01-01") == "until: must be after since"
    assert world.app.get("/v1/usage/series", params={"by": "node"}, headers=world.as_("root")).status_code == 422
