// Cluster overview: totals, the head's health, and every node as a grid of its GPUs, coloured by
// utilisation when telemetry reports it, else by which job holds each GPU.

import { api, ApiError } from "../api.js";
import { gpuMemoryUsed, gpuPower, gpuProblem, gpuTemperature, gpuUtilisation, nodeHealth } from "../telemetry.js";
import { fill, fmtDuration, fmtMemory, fmtNumber, h, jobColour, since, tick, unchanged, utilColour } from "../ui.js";

async function health() {
  try {
    return await api("/v1/health");
  } catch (e) {
    if (e instanceof ApiError && e.status === 503) return { status: "degraded", problem: e.message };
    throw e;
  }
}

function tile(label, value, { bad = false, testid } = {}) {
  return h("div", { class: `tile${bad ? " bad" : ""}`, "data-testid": testid }, h("div", { class: "tile-value" }, value),
    h("div", { class: "tile-label" }, label));
}

/** A GPU of `node` as a tile. `jobs` (id -> job) holds the running jobs the viewer may see: their
 * name and team are shown; a GPU held by another team's job shows its id only, as the API's
 * visibility rules say (GET /v1/nodes names no job's name or team). */
function gpuCell(node, gpu, jobs) {
  const util = gpuUtilisation(gpu);
  const problem = gpuProblem(gpu);
  const title = [`${node.name} GPU ${gpu.index}: ${gpu.model}, ${fmtMemory(gpu.memory_mb)}`];
  if (gpu.domain) title.push(`domain ${gpu.domain}`);
  const job = gpu.job_id !== null && gpu.job_id !== undefined ? jobs.get(gpu.job_id) : undefined;
  if (job) title.push(`job ${gpu.job_id}: ${job.name} (team ${job.spec.team})`);
  else if (gpu.job_id !== null && gpu.job_id !== undefined) title.push(`job ${gpu.job_id} (another team's)`);
  else title.push("free");
  if (util !== null) title.push(`utilisation ${fmtNumber(util, 0)}%`);
  const mem = gpuMemoryUsed(gpu);
  if (mem !== null) title.push(`memory used ${fmtMemory(mem)}`);
  const temp = gpuTemperature(gpu);
  if (temp !== null) title.push(`${fmtNumber(temp, 0)} °C`);
  const power = gpuPower(gpu);
  if (power !== null) title.push(`${fmtNumber(power, 0)} W`);
  if (problem) title.push(`unhealthy: ${problem}`);
  const busy = gpu.job_id !== null && gpu.job_id !== undefined;
  // A free GPU always looks free; a busy one shows its utilisation, or its job's colour without telemetry.
  let background;
  if (busy) background = util !== null ? utilColour(util) : jobColour(gpu.job_id);
  const cell = h(
    busy ? "a" : "div",
    {
      class: `gpu${busy ? " busy" : " free"}${problem ? " unhealthy" : ""}`,
      href: busy ? `#/jobs/${gpu.job_id}` : undefined,
      title: title.join("\n"),
      style: background ? { background } : undefined,
      "data-gpu": `${node.name}/${gpu.index}`,
      "data-job": busy ? gpu.job_id : undefined,
    },
    h("span", { class: "gpu-index" }, gpu.index),
    h("span", { class: "gpu-job" }, busy ? `#${gpu.job_id}` : "free"),
    job ? h("span", { class: "gpu-name", "data-testid": "gpu-job-name" }, job.name) : null,
    job ? h("span", { class: "gpu-name muted", "data-testid": "gpu-job-team" }, job.spec.team) : null,
    util !== null ? h("span", { class: "gpu-util" }, `${fmtNumber(util, 0)}%`) : null,
  );
  return cell;
}

/** " · CPUs 3/8 · memory 12.0/64.0 GiB" for a node that accounts them (--cpus, --mem); "" otherwise. */
function hostText(node) {
  const parts = [];
  if (node.cpus !== null && node.cpus !== undefined) parts.push(`CPUs ${fmtNumber(node.cpus_used || 0, 2)}/${fmtNumber(node.cpus, 2)}`);
  if (node.memory_mb !== null && node.memory_mb !== undefined) {
    parts.push(`memory ${((node.memory_used_mb || 0) / 1024).toFixed(1)}/${(node.memory_mb / 1024).toFixed(1)} GiB`);
  }
  return parts.length ? ` · ${parts.join(" · ")}` : "";
}

function nodeCard(node, jobs) {
  const state = nodeHealth(node);
  const models = [...new Set(node.gpus.map((g) => g.model))].join(", ");
  const used = node.gpus.filter((g) => g.job_id !== null && g.job_id !== undefined).length;
  const badges = [];
  if (node.virtual) badges.push(h("span", { class: "badge" }, "virtual"));
  if (state.drained) {
    badges.push(h("span", { class: "badge warn", title: `drained by ${state.drainedBy || "?"}` }, "drained"));
  }
  if (state.unhealthy) badges.push(h("span", { class: "badge bad", title: state.reason }, "unhealthy"));
  if (!state.drained && !state.unhealthy) badges.push(h("span", { class: "badge ok" }, "ready"));
  return h(
    "section",
    { class: "node card", "data-node": node.name },
    h("h3", {}, node.name, " ", badges),
    h("p", { class: "muted" }, `${models} · ${used} of ${node.gpus.length} GPUs in use`,
      hostText(node),
      state.lastReport ? [" · telemetry ", since(state.lastReport), " ago"] : null),
    state.reason ? h("p", { class: "reason", "data-testid": "node-reason" }, state.reason) : null,
    h("div", { class: "gpu-grid" }, node.gpus.map((g) => gpuCell(node, g, jobs))),
  );
}

function cycleText(age) {
  return `last scheduling cycle ${fmtDuration(age)} ago`;
}

export function overviewPage(root) {
  return {
    title: "Overview",
    async refresh() {
      const [nodes, status, running, queue] = await Promise.all([
        api("/v1/nodes"),
        health(),
        api("/v1/jobs?state=running"),
        api("/v1/queue"),
      ]);
      const age = status.last_cycle_age_s;
      if (unchanged(root, [nodes, status.status, status.problem, running, queue])) {
        const cycleEl = root.querySelector("[data-testid=last-cycle]");
        if (cycleEl && Number.isFinite(age)) cycleEl.textContent = cycleText(age);
        tick(root);
        return;
      }
      const jobs = new Map(running.jobs.map((j) => [j.id, j]));
      const gpus = nodes.nodes.flatMap((n) => n.gpus);
      const busy = gpus.filter((g) => g.job_id !== null && g.job_id !== undefined).length;
      const utils = gpus.map(gpuUtilisation).filter((u) => u !== null);
      const telemetry = utils.length > 0;
      const troubled = nodes.nodes.map(nodeHealth).filter((n) => n.drained || n.unhealthy).length;
      const tiles = [
        tile("GPUs in use", `${busy} / ${gpus.length}`, { testid: "gpus-in-use" }),
        tile("running jobs", running.jobs.length, { testid: "running-count" }),
        tile("queued jobs", queue.entries.length, { testid: "queued-count" }),
        troubled ? tile("nodes drained or unhealthy", troubled, { bad: true, testid: "troubled-nodes" }) : null,
        telemetry ? tile("mean utilisation", `${fmtNumber(utils.reduce((a, b) => a + b, 0) / utils.length, 0)}%`) : null,
        tile(
          "head",
          status.status === "ok" ? "ok" : "degraded",
          { bad: status.status !== "ok", testid: "head-health" },
        ),
      ];
      const problem = status.problem ? h("p", { class: "flash bad" }, `Scheduling: ${status.problem}`) : null;
      const legend = telemetry
        ? h("p", { class: "muted" },
          "A busy GPU's colour is its utilisation, from idle (blue) to busy (orange); click it for its job.")
        : h("p", { class: "muted" }, "A busy GPU has its job's colour (no utilisation telemetry); click it for its job.");
      const cycle = Number.isFinite(age) ? h("p", { class: "muted", "data-testid": "last-cycle" }, cycleText(age)) : null;
      fill(root,
        h("h1", {}, "Cluster"),
        h("div", { class: "tiles" }, tiles),
        problem,
        cycle,
        h("h2", {}, `Nodes (${nodes.nodes.length})`),
        legend,
        nodes.nodes.length
          ? h("div", { class: "nodes" }, nodes.nodes.map((n) => nodeCard(n, jobs)))
          : h("p", { class: "empty" }, "No nodes have registered yet."),
      );
    },
  };
}
