// Jobs: what runs now (with its GPUs and, when telemetry reports it, their live utilisation),
// what waits, and what ended recently. Each job links to its page.

import { api } from "../api.js";
import { gpuUtilisation } from "../telemetry.js";
import {
  fmtAllocation,
  fmtDuration,
  fmtNumber,
  gpusLabel,
  fill,
  h,
  jobLink,
  relative,
  since,
  stateBadge,
  table,
  tick,
  unchanged,
  utilColour,
} from "../ui.js";

const RECENT = 30;

/** The utilisation of each GPU a job holds, as small coloured chips; null without telemetry. */
function utilisationChips(job, byGpu) {
  const chips = [];
  for (const slice of job.allocation) {
    for (const index of slice.gpu_indices) {
      const util = byGpu.get(`${slice.node}/${index}`);
      if (util === undefined || util === null) continue;
      chips.push(h("span", { class: "chip", style: { background: utilColour(util) }, title: `${slice.node} GPU ${index}` },
        `${fmtNumber(util, 0)}%`));
    }
  }
  return chips.length ? chips : null;
}

// The first columns of every table on this page: id, name, team, state.
function leadCells(job) {
  return [
    h("td", {}, jobLink(job.id)),
    h("td", {}, job.name),
    h("td", {}, job.spec.team),
    h("td", {}, stateBadge(job.state)),
  ];
}

function runningRow(job, byGpu) {
  return h(
    "tr",
    { "data-job-id": job.id },
    ...leadCells(job),
    h("td", { class: "num" }, fmtNumber(job.allocation.reduce((n, s) => n + s.gpu_indices.length * s.share, 0), 2)),
    h("td", { class: "mono" }, fmtAllocation(job.allocation)),
    h("td", {}, utilisationChips(job, byGpu) ?? h("span", { class: "muted" }, "n/a")),
    h("td", {}, since(job.started_at)),
    h("td", {}, job.spec.time_limit ? relative(job.started_at + job.spec.time_limit) : ""),
    h("td", {}, job.attempt > 1 ? `attempt ${job.attempt}` : ""),
  );
}

function waitingRow(job) {
  return h(
    "tr",
    { "data-job-id": job.id },
    ...leadCells(job),
    h("td", { class: "num" }, gpusLabel(job.spec)),
    h("td", {}, since(job.submitted_at)),
    h("td", { class: "reason" }, job.reason),
  );
}

function endedRow(job) {
  return h(
    "tr",
    { "data-job-id": job.id },
    ...leadCells(job),
    h("td", { class: "num" }, gpusLabel(job.spec)),
    h("td", {}, relative(job.ended_at)),
    h("td", {}, job.started_at && job.ended_at ? fmtDuration(job.ended_at - job.started_at) : ""),
    h("td", { class: "num" }, job.exit_code ?? ""),
    h("td", { class: "reason" }, job.reason),
  );
}

export function jobsPage(root) {
  return {
    title: "Jobs",
    async refresh() {
      const [active, recent, nodes] = await Promise.all([
        api("/v1/jobs?state=running&state=queued&state=preempted"),
        api(`/v1/jobs?limit=${RECENT}`),
        api("/v1/nodes"),
      ]);
      const byGpu = new Map();
      for (const node of nodes.nodes) {
        for (const gpu of node.gpus) byGpu.set(`${node.name}/${gpu.index}`, gpuUtilisation(gpu));
      }
      const running = active.jobs.filter((j) => j.state === "running");
      const waiting = active.jobs.filter((j) => j.state !== "running");
      const ended = recent.jobs.filter((j) => !["running", "queued", "preempted"].includes(j.state)).reverse();
      if (!unchanged(root, [active, ended, [...byGpu]])) {
        fill(root,
          h("h1", {}, "Jobs"),
          h("h2", {}, `Running (${running.length})`),
          table(
            ["job", "name", "team", "state", "GPUs", "where", "utilisation", "running for", "time limit ends", ""],
            running.map((j) => runningRow(j, byGpu)),
            { empty: "Nothing runs.", testid: "running" },
          ),
          h("h2", {}, `Waiting (${waiting.length}) `, h("a", { href: "#/queue", class: "small" }, "in scheduling order")),
          table(["job", "name", "team", "state", "GPUs", "waiting", "why"], waiting.map(waitingRow), {
            empty: "Nothing waits.",
            testid: "waiting",
          }),
          h("h2", {}, "Recently ended"),
          table(["job", "name", "team", "state", "GPUs", "ended", "ran", "exit", "reason"], ended.map(endedRow), {
            empty: "No job has ended yet.",
            testid: "ended",
          }),
        );
      }
      tick(root);
    },
  };
}
