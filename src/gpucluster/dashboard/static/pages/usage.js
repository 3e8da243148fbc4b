// Per-team usage: fair-share standing from /v1/policy (always there), GPUs in use per team over
// time (sampled by this page while it is open), and accounting (GPU-hours, cost, budgets) when
// the head offers an accounting endpoint; until then the panel says there is no data yet.

import { api, ApiError, endpoints } from "../api.js";
import { barChart, lineChart } from "../charts.js";
import { ACCOUNTING_PATH, accountingPanel } from "./accounting.js";
import { fmtNumber, fill, h, table, unchanged } from "../ui.js";

const HISTORY_S = 3600;
const history = new Map(); // team -> [[unix, running GPUs], ...], kept across page visits

function record(teams) {
  const now = Date.now() / 1000;
  for (const t of teams) {
    if (t.running_gpus === null || t.running_gpus === undefined) continue; // another team's: not shown
    const points = history.get(t.name) || [];
    points.push([now, t.running_gpus]);
    while (points.length && points[0][0] < now - HISTORY_S) points.shift();
    history.set(t.name, points);
  }
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
      record(policy.teams);
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
      fill(live,
        h("h2", {}, "GPUs in use per team"),
        h("p", { class: "muted" }, "Sampled by this page while it is open (the last hour)."),
        lineChart(
          [...history].map(([name, points]) => ({ name, points })),
          { format: (v) => fmtNumber(v, 2), testid: "running-chart" },
        ),
      );
      if (!unchanged(accountingEl, acct)) fill(accountingEl, ...accountingPanel(acct));
    },
  };
}
