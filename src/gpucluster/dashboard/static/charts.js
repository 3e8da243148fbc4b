// Inline SVG charts: enough for usage and cost, no library to vendor.

import { fmtNumber, h, svg } from "./ui.js";

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];

export function seriesColour(i) {
  return PALETTE[i % PALETTE.length];
}

/**
 * Grouped horizontal bars: rows [{label, values: [number...]}], one colour per value slot named
 * in `keys`. `max` fixes the scale (e.g. 1 for shares); a `limit` per row draws a budget mark;
 * `labels` per row, if given, are written next to its bars instead of `format(value)`.
 */
export function barChart(rows, keys, { max, format = (v) => fmtNumber(v, 2), testid } = {}) {
  const barH = 14;
  const gap = 4;
  const labelW = 120;
  const width = 560;
  const plotW = width - labelW - 70;
  const groupH = keys.length * (barH + 2) + gap * 2;
  const height = rows.length * groupH + 8;
  const top = Math.max(
    max ?? 0,
    ...rows.flatMap((r) => r.values.filter(Number.isFinite)),
    ...rows.map((r) => r.limit ?? 0),
  );
  const scale = (v) => (top > 0 ? (Math.max(0, v) / top) * plotW : 0);
  const parts = [];
  rows.forEach((row, i) => {
    const y0 = i * groupH + gap;
    parts.push(svg("text", { x: labelW - 6, y: y0 + groupH / 2, "text-anchor": "end", class: "chart-label" }, row.label));
    row.values.forEach((v, k) => {
      if (!Number.isFinite(v)) return;
      const y = y0 + k * (barH + 2);
      const text = row.labels?.[k] ?? format(v);
      parts.push(
        svg("rect", { x: labelW, y, width: Math.max(1, scale(v)), height: barH, fill: seriesColour(k), rx: 2,
          "data-value": v },
        svg("title", {}, `${row.label} ${keys[k]}: ${text}`)),
      );
      parts.push(svg("text", { x: labelW + scale(v) + 4, y: y + barH - 3, class: "chart-value" }, text));
    });
    if (Number.isFinite(row.limit)) {
      const x = labelW + scale(row.limit);
      parts.push(svg("line", { x1: x, x2: x, y1: y0 - 2, y2: y0 + groupH - gap, class: "chart-limit" },
        svg("title", {}, `budget ${format(row.limit)}`)));
    }
  });
  return h(
    "figure",
    { class: "chart", "data-testid": testid },
    svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img" }, parts),
    legend(keys),
  );
}

/**
 * Lines over time: series [{name, points: [[unixSeconds, value], ...]}]. `timeFormat` labels the
 * time axis (default hours:minutes; days for charts of many days).
 */
export function lineChart(series, { format = (v) => fmtNumber(v, 2), testid, height = 180, max, timeFormat = timeLabel } = {}) {
  const width = 560;
  const pad = { l: 48, r: 12, t: 10, b: 22 };
  const pts = series.flatMap((s) => s.points);
  if (pts.length < 2) return h("p", { class: "empty", "data-testid": testid }, "collecting data points…");
  const t0 = Math.min(...pts.map((p) => p[0]));
  const t1 = Math.max(...pts.map((p) => p[0]));
  const vmax = max ?? Math.max(1e-9, ...pts.map((p) => p[1]));
  const x = (t) => pad.l + ((t - t0) / Math.max(1e-9, t1 - t0)) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - (v / vmax) * (height - pad.t - pad.b);
  const parts = [
    svg("line", { x1: pad.l, x2: width - pad.r, y1: height - pad.b, y2: height - pad.b, class: "chart-axis" }),
    svg("text", { x: pad.l - 4, y: pad.t + 8, "text-anchor": "end", class: "chart-value" }, format(vmax)),
    svg("text", { x: pad.l - 4, y: height - pad.b, "text-anchor": "end", class: "chart-value" }, "0"),
    svg("text", { x: pad.l, y: height - 6, class: "chart-value" }, timeFormat(t0)),
    svg("text", { x: width - pad.r, y: height - 6, "text-anchor": "end", class: "chart-value" }, timeFormat(t1)),
  ];
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map((p, k) => `${k ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    parts.push(svg("path", { d, fill: "none", stroke: seriesColour(i), "stroke-width": 2 }, svg("title", {}, s.name)));
  });
  return h(
    "figure",
    { class: "chart", "data-testid": testid },
    svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img" }, parts),
    legend(series.map((s) => s.name)),
  );
}

/** A day's label, for charts whose points are days apart. */
export function dayLabel(unix) {
  return new Date(unix * 1000).toLocaleDateString([], { month: "short", day: "numeric" });
}

function timeLabel(unix) {
  return new Date(unix * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function legend(names) {
  return h(
    "figcaption",
    { class: "legend" },
    names.map((name, i) => h("span", {}, h("i", { style: { background: seriesColour(i) } }), name)),
  );
}
