// A pipeline drawn as a graph: the jobs a job waits for (to its left) and the jobs waiting for it
// (to its right), one column per step, an arrow per dependency, each box with its state and its
// expected start and end (GET /v1/jobs/{id}/pipeline). Plain SVG built from text nodes: no
// library, and a job's name cannot inject markup.

import { fmtRelative, fmtTime, svg } from "../ui.js";

const W = 200; // box
const H = 58;
const GAP_X = 56;
const GAP_Y = 14;

function timing(job) {
  if (job.state === "running" && job.expected_end) return `ends ~${fmtRelative(job.expected_end)}`;
  if (job.expected_start) return `starts ~${fmtRelative(job.expected_start)}`;
  if (job.ended_at) return `ended ${fmtTime(job.ended_at)}`;
  if (job.started_at) return `started ${fmtTime(job.started_at)}`;
  return "";
}

function counts(job) {
  if (!job.array_counts) return "";
  return Object.entries(job.array_counts).sort().map(([s, n]) => `${n} ${s}`).join(", ");
}

function title(job) {
  const text = `#${job.id}${job.array_counts ? "[]" : ""} ${job.name}`;
  return text.length > 30 ? `${text.slice(0, 29)}…` : text;
}

/** The drawing, or null when the job is not part of a pipeline. */
export function pipelineGraph(body, currentId) {
  if (!body || body.jobs.length < 2) return null;
  const depths = [...new Set(body.jobs.map((j) => j.depth))].sort((a, b) => a - b);
  const columns = new Map(depths.map((d) => [d, body.jobs.filter((j) => j.depth === d)]));
  const rows = Math.max(...[...columns.values()].map((c) => c.length));
  const where = new Map();
  depths.forEach((d, x) => columns.get(d).forEach((job, y) => where.set(job.id, { x: x * (W + GAP_X), y: y * (H + GAP_Y) })));
  const width = depths.length * (W + GAP_X) - GAP_X + 2;
  const height = rows * (H + GAP_Y) - GAP_Y + 2;
  const arrows = body.edges.filter((e) => where.has(e.source) && where.has(e.target)).map((e) => {
    const a = where.get(e.source);
    const b = where.get(e.target);
    const x1 = a.x + W;
    const y1 = a.y + H / 2;
    const x2 = b.x - 2;
    const y2 = b.y + H / 2;
    return svg("g", { class: "edge", "data-edge": `${e.source}-${e.target}` },
      svg("path", { d: `M${x1},${y1} C${x1 + GAP_X / 2},${y1} ${x2 - GAP_X / 2},${y2} ${x2},${y2}`, "marker-end": "url(#arrow)" }),
      svg("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, "text-anchor": "middle", class: "kind" }, e.kind),
    );
  });
  const boxes = body.jobs.map((job) => {
    const p = where.get(job.id);
    const link = svg("a", { href: `#/jobs/${job.id}` },
      svg("rect", { x: p.x + 1, y: p.y + 1, width: W - 2, height: H - 2, rx: 5, class: `state-${job.state}` }),
      svg("text", { x: p.x + 8, y: p.y + 17, class: "name" }, title(job)),
      svg("text", { x: p.x + 8, y: p.y + 33, class: "state" }, job.array_counts ? counts(job) : job.state),
      svg("text", { x: p.x + 8, y: p.y + 49, class: "when" }, timing(job)),
    );
    return svg("g", {
      class: `step${job.id === currentId ? " current" : ""}`,
      "data-job": job.id,
      "data-state": job.state,
      "data-depth": job.depth,
    }, link);
  });
  return svg("svg", {
    class: "pipeline",
    "data-testid": "pipeline",
    width,
    height,
    viewBox: `-1 -1 ${width} ${height}`,
    role: "img",
    "aria-label": `pipeline of ${body.jobs.length} jobs`,
  },
  svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
    svg("path", { d: "M0,0 L10,5 L0,10 z" }))),
  arrows,
  boxes,
  );
}
