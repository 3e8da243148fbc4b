// Per-team usage: fair-share standing from /v1/policy (always there), GPUs in use per team over
// the last hour (from the head's accounting, GET /v1/usage/series by the minute, so the chart is
// full the moment the page opens), and accounting (GPU-hours, cost, budgets) when the head offers
// an accounting endpoint; until then the panel says there is no data yet.

import { api, ApiError, endpoints } from "../api.js";
import { barChart, lineChart } from "../charts.js";
import { ACCOUNTING_PATH, accountingPanel } from "./accounting.js";
import { fmtNumber, fill, h, table, unchanged } from "../ui.js";

const HISTORY = "1h";
const STEP_S = 60;
const SERIES = "/v1/usage/series";

/**
 * GPUs in use per team, one point a minute over the last hour: each bucket's GPU-hours divided
 * by its length are the mean GPUs the team held in it. A bucket cut short at either end of the
 * window (under half a step) is left out: its mean would rest on a few seconds, and the current
 * minute is accrued only up to a few seconds ago. The last point is each team's running GPUs now
 * (GET /v1/policy's `running_gpus`, null for teams the viewer may not see), so the line ends at
 * the present.
 */
async function inUse(teams) {
  if (!(await endpoints()).has(SERIES)) return null;
  const body = await api(`${SERIES}?by=team&since=${HISTORY}&step=${STEP_S}s`);
  const edges = [...(body.buckets || []), body.until];
  const keep = [];
  for (let i = 0; i + 1 < edges.length; i++) {
    const length = edges[i + 1] - edges[i];
    if (length >= STEP_S / 2) keep.push([i, edges[i], length]);
  }
  const lines = new Map();
  for (const s of body.series || []) {
    lines.set(s.key, keep.map(([i, at, length]) => [at, ((s.gpu_hours || [])[i] ?? 0) * 3600 / length]));
  }
  for (const t of teams) {
    if (t.running_gpus === null || t.running_gpus === undefined) continue;
    if (!lines.has(t.name) && !t.running_gpus) continue; // idle all hour: no line
    if (!lines.has(t.name)) lines.set(t.name, keep.map(([, at]) => [at, 0]));
    lines.get(t.name).push([body.until, t.running_gpus]);
  }
  return { since: body.since, series: [...lines].map(([name, points]) => ({ name, points })) };
}

function teamRow(t, totalUsage) {
  const quota = Object.entries(t.quota || {}).map(([m, n]) => `${m}: ${fmtNumber(n, 2)}`).join(", ");
  return h(
    "tr",
    { "data-team": t.name },
    h("td", {}, t.name),
    h("td", {}, t.org ?? ""),
    h("td", { class: "num" }, fmtNumber(t.weight, 2)),
    h("td", { class: "num" }, `${fmtNumber(t.share * 100, 1)}%`),
    h("td", { class: "num" }, totalUsage > 0 ? `${fmtNumber((t.usage_gpu_hours / totalUsage) * 100, 1)}%` : ""),
    h("td", { class: "num" }, fmtNumber(t.usage_gpu_hours, 2)),
    h("td", { class: "num" }, fmtNumber(t.running_gpus, 2)),
    h("td", {}, quota || "none"),
  );
}

async function accounting() {
  const available = [...(await endpoints())].filter((p) => ACCOUNTING_PATH.test(p)).sort();
  if (!available.length) return null;
  const data = {};
  for (const path of available) {
    try {
      data[path] = await api(path);
    } catch (e) {
      if (!(e instanceof ApiError) || e.status === 401) throw e;
      data[path] = { error: e.message, status: e.status };
    }
  }
  return data;
}

export function usagePage(root) {
  const standing = h("section");
  const live = h("section");
  const accountingEl = h("section", { "data-testid": "accounting" });
  fill(root, h("h1", {}, "Usage"), standing, live, accountingEl);
  return {
    title: "Usage",
    async refresh() {
      const [policy, acct] = await Promise.all([api("/v1/policy"), accounting()]);
      const running = await inUse(policy.teams);
      const totalUsage = policy.teams.reduce((n, t) => n + t.usage_gpu_hours, 0);
      if (!unchanged(standing, policy)) {
        fill(standing,
          h("h2", {}, "Fair share"),
          h(
            "p",
            { class: "muted" },
            policy.fair_share
              ? `Usage is GPU-hours decayed with a half-life of ${fmtNumber(policy.half_life_s / 86400, 1)} days; `
                + "a team below its share goes first."
              : "Fair share is off in this policy; usage is shown for information.",
            policy.ordering
              ? (policy.ordering.mode === "las"
                ? " Inside a team's line, jobs that have had less GPU-time go first (las)."
                : " Inside a team's line, oldest first.")
              : "",
            ` Policy: ${policy.source}.`,
            policy.error ? h("span", { class: "bad" }, ` The policy file has an error, the previous policy runs: ${policy.error}`) : null,
          ),
          barChart(
            policy.teams.map((t) => ({
              label: t.name,
              values: [t.share, totalUsage > 0 ? t.usage_gpu_hours / totalUsage : 0],
            })),
            ["entitled share", "share of recent usage"],
            { max: 1, format: (v) => `${fmtNumber(v * 100, 1)}%`, testid: "share-chart" },
          ),
          table(
            ["team", "org", "weight", "share", "of usage", "GPU-hours (decayed)", "running GPUs", "quota"],
            policy.teams.map((t) => teamRow(t, totalUsage)),
            { empty: "No teams yet.", testid: "teams" },
          ),
        );
      }
      if (!unchanged(live, running)) {
        fill(live,
          h("h2", {}, "GPUs in use per team"),
          running === null
            ? h("p", { class: "empty", "data-testid": "running-chart" }, "This head keeps no usage over time.")
            : [
              h("p", { class: "muted" }, "The last hour, each team's mean GPUs a minute, from the head's accounting ",
                "(your teams'; a cluster admin sees all)."),
              running.series.length
                ? lineChart(running.series, { format: (v) => fmtNumber(v, 2), testid: "running-chart" })
                : h("p", { class: "empty", "data-testid": "running-chart" }, "No GPU was in use in the last hour."),
            ],
        );
        const chart = live.querySelector("figure[data-testid=running-chart]");
        if (chart) chart.dataset.since = String(running.since); // where its data starts (tests)
      }
      if (!unchanged(accountingEl, acct)) fill(accountingEl, ...accountingPanel(acct));
    },
  };
}
