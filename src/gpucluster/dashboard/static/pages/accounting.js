// The accounting panel of the usage page: GPU-hours, cost, energy, utilisation and lost work per
// team over the last 30 days (GET /v1/usage), the same per team and day as charts over time
// (GET /v1/usage/series), and each budget against what its team spent in the current period
// (GET /v1/budgets). A head without these endpoints gets "no accounting data yet".

import { barChart, dayLabel, lineChart } from "../charts.js";
import { fmtNumber, fmtTime, h, table } from "../ui.js";

// Accounting endpoints, found in the head's OpenAPI document (GET, no path parameters).
export const ACCOUNTING_PATH = /^\/v1\/(usage|budgets?|accounting|costs?)(\/[^{}]*)?$/;

const num = (v, digits = 2) => h("td", { class: "num" }, v === null || v === undefined ? "-" : fmtNumber(v, digits));

function usageRow(r, isTotal) {
  return h(
    "tr",
    { "data-usage": r.key, class: isTotal ? "total" : "" },
    h("td", {}, isTotal ? "total" : r.key),
    num(r.gpu_hours),
    num(r.cost),
    num(r.energy_kwh, 3),
    h("td", { class: "num" }, r.utilization === null || r.utilization === undefined ? "-" : `${fmtNumber(r.utilization, 0)}%`),
    num(r.lost_gpu_hours_failures),
    num(r.lost_gpu_hours_preemption),
    num(r.jobs, 0),
  );
}

/** GET /v1/usage: {by, since, until, rows: [{key, gpu_hours, cost, energy_kwh, utilization, ...}], total}. */
function usageSection(body) {
  const rows = body.rows || [];
  const since = body.since ? `since ${fmtTime(body.since)}` : "all time";
  const out = [h("h3", {}, `GPU time and cost by ${body.by || "team"}, ${since}`)];
  if (!rows.length) return [...out, h("p", { class: "empty" }, "No usage recorded yet.")];
  const priced = rows.some((r) => r.cost > 0);
  out.push(
    barChart(
      rows.map((r) => ({ label: r.key, values: [priced ? r.cost : r.gpu_hours] })),
      [priced ? "cost" : "GPU-hours"],
      { testid: "usage-chart" },
    ),
  );
  out.push(
    table(
      [body.by || "team", "GPU-hours", "cost", "energy kWh", "utilisation", "lost to failures (GPU-h)", "lost to preemption (GPU-h)", "jobs"],
      [...rows.map((r) => usageRow(r, false)), ...(body.total ? [usageRow(body.total, true)] : [])],
      { testid: "usage", empty: "No rows." },
    ),
  );
  return out;
}

/**
 * GET /v1/usage/series (its defaults: by team, 30 days, a bucket a day): {by, step, buckets:
 * [unix...], series: [{key, gpu_hours: [...], cost: [...], energy_kwh: [...]}]}. One chart per
 * measure, a line per team; cost and energy only where some bucket has any.
 */
function seriesSection(body) {
  const series = body.series || [];
  const buckets = body.buckets || [];
  const step = body.step || 86400;
  const per = step >= 86400 ? (step === 86400 ? "day" : `${fmtNumber(step / 86400, 1)} days`) : `${fmtNumber(step / 3600, 1)} h`;
  const out = [h("h3", {}, `Usage over time by ${body.by || "team"}, per ${per}`)];
  if (!series.length) return [...out, h("p", { class: "empty", "data-testid": "usage-series-empty" }, "No usage recorded yet.")];
  const timeFormat = step >= 86400 ? dayLabel : undefined;
  const lines = (field) => series.map((s) => ({ name: s.key, points: buckets.map((t, i) => [t, (s[field] || [])[i] ?? 0]) }));
  const any = (field) => series.some((s) => (s[field] || []).some((v) => v > 0));
  for (const [field, title, digits] of [["cost", "cost", 2], ["gpu_hours", "GPU-hours", 2], ["energy_kwh", "energy (kWh)", 3]]) {
    if (field !== "gpu_hours" && !any(field)) continue;
    out.push(
      h("h4", {}, title),
      lineChart(lines(field), { format: (v) => fmtNumber(v, v > 0 && v < 0.1 ? 4 : digits), testid: `usage-series-${field}`, timeFormat }),
    );
  }
  return out;
}

function spentOf(b, what) {
  const limit = b[`${what}_limit`];
  return limit === null || limit === undefined ? "-" : `${fmtNumber(b[`${what}_spent`], 2)} of ${fmtNumber(limit, 2)}`;
}

/** GET /v1/budgets: {budgets: [{team, period, period_end, money_limit, money_spent, gpu_hours_*, over, held, held_jobs}]}. */
function budgetSection(body) {
  const rows = body.budgets || [];
  const out = [h("h3", {}, "Budgets")];
  if (!rows.length) return [...out, h("p", { class: "empty" }, "No budgets are set.")];
  // Each budget on its own scale, the share of its limit spent (100% is the line): money and
  // GPU-hours on one axis made a 97%-spent budget of 100 a sliver next to one of 5,000 GPU-hours.
  const bars = [];
  for (const b of rows) {
    for (const [what, name, unit] of [["money", "money", ""], ["gpu_hours", "GPU-hours", " GPU-h"]]) {
      const limit = b[`${what}_limit`];
      if (limit === null || limit === undefined) continue;
      const spent = b[`${what}_spent`] || 0;
      const share = limit > 0 ? spent / limit : spent > 0 ? Infinity : 0;
      bars.push({
        label: `${b.team} ${name}`,
        values: [Number.isFinite(share) ? share : 1],
        limit: 1,
        labels: [`${Number.isFinite(share) ? fmtNumber(share * 100, 1) : "∞"}% (${fmtNumber(spent, 2)} of ${fmtNumber(limit, 2)}${unit})`],
      });
    }
  }
  out.push(
    barChart(bars, ["spent this period, of its limit (line: 100%)"], {
      max: 1,
      format: (v) => `${fmtNumber(v * 100, 1)}%`,
      testid: "budget-chart",
    }),
  );
  out.push(
    table(
      ["team", "period", "rolls over", "money", "GPU-hours", "when over", "state"],
      rows.map((b) =>
        h(
          "tr",
          { "data-budget": b.team },
          h("td", {}, b.team),
          h("td", {}, b.period),
          h("td", {}, fmtTime(b.period_end)),
          h("td", { class: "num" }, spentOf(b, "money")),
          h("td", { class: "num" }, spentOf(b, "gpu_hours")),
          h("td", {}, b.on_exceed === "stop" ? "running jobs stopped" : "running jobs finish"),
          h("td", { class: b.over ? "bad" : "", title: b.held || "" }, b.over ? `over: ${b.held_jobs} job(s) held` : "ok"),
        ),
      ),
      { testid: "budgets", empty: "No budgets are set." },
    ),
  );
  return out;
}

/** The panel's elements for `data` ({path: body}), or the empty state for null. */
export function accountingPanel(data) {
  const title = h("h2", {}, "Cost and budgets");
  if (!data) {
    return [
      title,
      h("p", { class: "empty", "data-testid": "no-accounting" },
        "No accounting data yet: this head does not report GPU-hours, cost or budgets."),
    ];
  }
  const out = [title];
  // The usage table, then its charts over time, then budgets.
  const rank = (p) => (p.endsWith("/series") ? 1 : p.includes("usage") ? 0 : 2);
  for (const [path, body] of Object.entries(data).sort(([a], [b]) => rank(a) - rank(b))) {
    if (body && body.error && body.status) {
      out.push(h("p", { class: "flash bad" }, `${path}: ${body.error}`));
    } else if (path.includes("budget")) {
      out.push(...budgetSection(body || {}));
    } else if (path.endsWith("/series")) {
      out.push(...seriesSection(body || {}));
    } else {
      out.push(...usageSection(body || {}));
    }
  }
  return out;
}
