// One job: its spec, state and why, every state change, every attempt with what it lost, its
// progress, and its log following live. Cancel and requeue go through the same API as the CLI.

import { api, ApiError, hasEndpoint } from "../api.js";
import { lineChart } from "../charts.js";
import { LogTail } from "../logtail.js";
import { pipelineGraph } from "./pipeline.js";
import {
  fmtAllocation,
  fmtDuration,
  fmtMemory,
  fmtNumber,
  fmtTime,
  estimateAssumption,
  gpusLabel,
  fill,
  h,
  relative,
  runSeconds,
  startWindow,
  stateBadge,
  table,
  tick,
  unchanged,
  utilColour,
} from "../ui.js";

const TERMINAL = ["succeeded", "failed", "cancelled"];

function field(label, ...value) {
  return [h("dt", {}, label), h("dd", {}, ...value)];
}

function specFields(job, policy) {
  const s = job.spec;
  const mode = s.per_gpu ? "one process per GPU" : s.launcher ? `${s.launcher} per node` : "one process";
  return h(
    "dl",
    { class: "fields" },
    field("team", s.team),
    field("priority", s.priority),
    field("GPUs", gpusLabel(s), s.gpu_type ? ` × ${[s.gpu_type].flat().join(" or ")}` : ""),
    s.nodes ? field("nodes", s.nodes) : null,
    field("mode", mode),
    job.kind === "session" ? field("kind", "interactive session: ", h("code", {}, `gpucluster attach ${job.id}`)) : null,
    field("command", h("code", {}, s.shell ? s.command[0] : s.command.map(quote).join(" "))),
    s.workdir ? field("workdir", h("code", {}, s.workdir)) : null,
    field("time limit", s.time_limit ? fmtDuration(s.time_limit) : "none"),
    job.expected_run ? field("run time", h("span", { "data-testid": "expected-run" }, job.expected_run.sentence)) : null,
    field("restarts", `${job.restarts} of ${s.max_restarts}`),
    field("submitted", fmtTime(job.submitted_at)),
    job.started_at ? field("started", fmtTime(job.started_at)) : null,
    job.ended_at ? field("ended", fmtTime(job.ended_at)) : null,
    job.attempt > 0
      ? field("ran", h("span", { "data-testid": "ran" }, fmtDuration(runSeconds(job))),
        job.attempt > 1 ? ` over ${job.attempt} attempts (not counting its waits in the queue)` : "")
      : null,
    job.exit_code !== null ? field("exit code", job.exit_code) : null,
    job.allocation.length ? field("GPUs held", h("code", {}, fmtAllocation(job.allocation))) : null,
    job.estimated_start
      ? field("estimated start", startWindow(job), " ",
        h("span", { class: "muted", "data-testid": "estimate-assumption" }, `(${estimateAssumption(policy)})`))
      : null,
    job.not_before && job.state === "queued" ? field("restart not before", relative(job.not_before)) : null,
  );
}

function quote(arg) {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", "'\\''")}'`;
}

function progressFields(progress) {
  if (!progress) return null;
  return h(
    "dl",
    { class: "fields" },
    progress.step !== null ? field("step", fmtNumber(progress.step, 0)) : null,
    progress.reported_at ? field("reported", relative(progress.reported_at)) : null,
    progress.checkpoint_at ? field("last checkpoint", relative(progress.checkpoint_at)) : null,
    progress.checkpoint_step !== null ? field("checkpoint step", fmtNumber(progress.checkpoint_step, 0)) : null,
  );
}

/** One chart per metric the script reports (gpucluster.train.report), a line per attempt. */
function metricsSection(job) {
  const metrics = job.metrics || [];
  if (!metrics.length) return null;
  const names = [...new Set(metrics.map((m) => m.name))].sort();
  return [
    h("h2", {}, "Training metrics"),
    names.map((name) =>
      h("div", { class: "metric", "data-metric": name },
        h("h3", {}, name, " ", h("span", { class: "muted" }, lastValue(metrics, name))),
        lineChart(
          metrics.filter((m) => m.name === name).map((m) => ({
            name: `attempt ${m.attempt}`,
            points: m.at.map((t, i) => [t, m.reported[i]]),
          })),
          { format: (v) => fmtNumber(v, 3), testid: `metric-chart-${name}` },
        ),
      ),
    ),
  ];
}

function lastValue(metrics, name) {
  const last = metrics.filter((m) => m.name === name).at(-1);
  const i = last.reported.length - 1;
  return `${fmtNumber(last.reported[i], 4)}${last.steps[i] !== null ? ` at step ${last.steps[i]}` : ""}`;
}

function rankCount(job) {
  const slices = job.allocation || [];
  if (job.spec.per_gpu) return slices.reduce((n, s) => n + s.gpu_indices.length, 0);
  return slices.length;
}

function eventRows(job) {
  return job.events.map((e) =>
    h("tr", {}, h("td", {}, fmtTime(e.at)), h("td", {}, stateBadge(e.state)), h("td", { class: "reason" }, e.reason)),
  );
}

function attemptRows(job) {
  return job.attempts.map((a) =>
    h(
      "tr",
      { "data-attempt": a.attempt },
      h("td", { class: "num" }, a.attempt),
      h("td", {}, fmtTime(a.started_at)),
      h("td", {}, a.started_at ? fmtDuration((a.ended_at ?? Date.now() / 1000) - a.started_at) : ""),
      h("td", { class: "num" }, fmtNumber(a.gpus, 2)),
      h("td", { class: "mono" }, fmtAllocation(a.allocation)),
      h("td", {}, stateBadge(a.outcome)),
      h("td", { class: "reason" }, a.reason),
      h("td", { class: "mono" }, a.exit_codes.map((c) => (c === null ? "lost" : c)).join(" ")),
      h("td", {}, a.work_lost_s !== null ? fmtDuration(a.work_lost_s) : ""),
    ),
  );
}

const SAMPLES = "/v1/telemetry/samples";
const SAMPLE_WINDOW_S = 3600;

/** Utilisation of the job's GPUs over (at most) the last hour of its latest attempt, per GPU. */
async function utilisationSeries(job) {
  const end = job.ended_at ?? Date.now() / 1000;
  const since = Math.max(job.started_at, end - SAMPLE_WINDOW_S);
  const body = await api(`${SAMPLES}?job=${job.id}&since=${since}&limit=2000`);
  const byGpu = new Map();
  for (const s of body.samples) {
    if (s.utilization === null || s.utilization === undefined) continue;
    const key = `${s.node} GPU ${s.gpu}`;
    if (!byGpu.has(key)) byGpu.set(key, []);
    byGpu.get(key).push([s.at, s.utilization]);
  }
  return [...byGpu].map(([name, points]) => ({ name, points }));
}

function telemetrySection(job, series) {
  const now = job.gpu_usage.map((u) =>
    h("span", {
      class: "chip",
      title: `read ${fmtTime(u.at)}`,
      style: u.utilization !== null ? { background: utilColour(u.utilization) } : undefined,
    }, `${u.node}:${u.gpu} `,
      u.utilization !== null ? `${fmtNumber(u.utilization, 0)}%` : "?",
      u.memory_mb !== null ? ` · ${fmtMemory(u.memory_mb)}` : ""),
  );
  if (!now.length && !(series && series.length)) return [];
  return [
    h("h2", {}, "GPU utilisation"),
    now.length ? h("p", { "data-testid": "gpu-usage" }, "now: ", now) : null,
    series ? lineChart(series, { max: 100, format: (v) => `${fmtNumber(v, 0)}%`, testid: "utilisation-chart" }) : null,
  ];
}

export function jobPage(root, id) {
  const log = new LogTail(id);
  const head = h("div");
  const details = h("div");
  const pipeline = h("div", { class: "pipeline-wrap" });
  const telemetry = h("div");
  let samplesDone = false; // an ended attempt's samples are fetched once
  const attemptSelect = h("select", { "aria-label": "attempt" });
  const rankInput = h("input", { type: "number", min: 0, value: 0, "aria-label": "rank", class: "rank" });
  const allRanks = h("input", { type: "checkbox", "aria-label": "all ranks", "data-testid": "all-ranks" });
  const rankLabel = h("label", { hidden: true }, " rank ", rankInput, h("label", {}, " all ranks ", allRanks));
  const flash = h("p", { class: "flash", hidden: true });
  let job = null;
  let policy = null; // for what estimates assume; read while the job waits
  let chosenAttempt = "latest";

  async function refreshTelemetry() {
    const running = job.state === "running";
    if (!job.started_at || (!running && samplesDone) || job.gpu_usage === undefined) return;
    const series = (await hasEndpoint(SAMPLES)) ? await utilisationSeries(job) : null;
    samplesDone = !running;
    if (!unchanged(telemetry, [job.gpu_usage, series])) fill(telemetry, telemetrySection(job, series));
  }

  /** The jobs before and after this one, drawn when it is part of a pipeline; redrawn when a step
   * changes, and every 30 s for the relative times. A job in no pipeline is asked again only
   * every 10 s (a dependent may be submitted later): finding dependents costs the head a scan. */
  let pipelineAsked = 0;
  let inPipeline = false;
  async function refreshPipeline() {
    if (!inPipeline && Date.now() - pipelineAsked < 10000) return;
    pipelineAsked = Date.now();
    const chain = await api(`/v1/jobs/${id}/pipeline`);
    inPipeline = chain.jobs.length > 1;
    if (unchanged(pipeline, [chain, Math.floor(Date.now() / 30000)])) return;
    const graph = pipelineGraph(chain, job.array_id ?? job.id);
    fill(pipeline, graph ? [h("h2", {}, "Pipeline"), graph] : null);
  }

  async function act(action) {
    flash.hidden = true;
    try {
      await api(`/v1/jobs/${id}/${action}`, { method: "POST" });
    } catch (e) {
      flash.textContent = `${action}: ${e.message}`;
      flash.className = "flash bad";
      flash.hidden = false;
    }
  }

  function followLog() {
    const latest = job.attempt;
    const attempt = chosenAttempt === "latest" ? latest : Number(chosenAttempt);
    const distributed = job.spec.per_gpu || Boolean(job.spec.launcher);
    rankLabel.hidden = !distributed;
    rankInput.disabled = allRanks.checked;
    if (distributed && allRanks.checked && attempt && rankCount(job)) log.followAll(attempt, rankCount(job));
    else log.follow(attempt, distributed ? Math.max(0, Number(rankInput.value) || 0) : null);
  }

  attemptSelect.addEventListener("change", () => {
    chosenAttempt = attemptSelect.value;
    followLog();
  });
  rankInput.addEventListener("change", followLog);
  allRanks.addEventListener("change", followLog);

  fill(root,
    head,
    flash,
    pipeline,
    details,
    telemetry,
    h("h2", {}, "Log ", h("span", { class: "controls" }, h("label", {}, "attempt ", attemptSelect), rankLabel)),
    log.el,
  );

  return {
    title: `Job ${id}`,
    async refresh() {
      try {
        job = await api(`/v1/jobs/${id}`);
      } catch (e) {
        if (!(e instanceof ApiError && e.status === 404)) throw e;
        if (!unchanged(head, "missing")) fill(head, h("h1", {}, `Job ${id}`), h("p", { class: "flash bad" }, e.message));
        return;
      }
      if (job.estimated_start && policy === null) policy = await api("/v1/policy");
      const live = !TERMINAL.includes(job.state);
      if (!unchanged(head, [job.name, job.state, job.reason, job.flags])) {
        fill(head,
          h("h1", { "data-testid": "job-title" }, `Job ${job.id}: ${job.name} `, stateBadge(job.state)),
          h("p", { class: "reason", "data-testid": "job-reason" }, job.reason),
          (job.flags || []).map((f) => h("p", { class: "flash bad", "data-flag": f.flag }, `${f.flag}: ${f.message}`)),
          h(
            "div",
            { class: "actions" },
            live ? h("button", { type: "button", onclick: () => act("cancel") }, "Cancel") : null,
            job.state === "running"
              ? h("button", { type: "button", onclick: () => act("requeue"), title: "checkpoint and requeue" }, "Requeue")
              : null,
          ),
        );
      }
      await refreshPipeline();
      if (!unchanged(details, job)) {
        fill(details,
          specFields(job, policy),
          job.progress ? h("h2", {}, "Progress") : null,
          progressFields(job.progress),
          metricsSection(job),
          h("h2", {}, "State history"),
          table(["at", "state", "reason"], eventRows(job), { testid: "events" }),
          h("h2", {}, "Attempts"),
          table(
            ["#", "started", "ran", "GPUs", "where", "outcome", "reason", "exit codes", "work lost"],
            attemptRows(job),
            { empty: "Not started yet.", testid: "attempts" },
          ),
        );
      }
      if (attemptSelect.options.length !== job.attempt + 1) {
        fill(attemptSelect,
          h("option", { value: "latest" }, "latest"),
          ...Array.from({ length: job.attempt }, (_, i) => h("option", { value: i + 1 }, String(i + 1))),
        );
        attemptSelect.value = chosenAttempt;
      }
      followLog();
      await refreshTelemetry();
      tick(root);
    },
    dispose() {
      log.stop();
    },
  };
}
