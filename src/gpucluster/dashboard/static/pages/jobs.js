// Jobs: what runs now (with its GPUs and, when telemetry reports it, their live utilisation),
// what waits, and every ended job a page at a time, newest first. One filter (state, team, text
// in the name, owner or id) narrows all three; the filtering and paging are the API's
// (GET /v1/jobs?state=&team=&q=&limit=&offset=), so a cluster with a million ended jobs pages
// through them without the browser loading them all.

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
  runSeconds,
  since,
  stateBadge,
  table,
  tick,
  unchanged,
  utilColour,
} from "../ui.js";

// Ended jobs a page; `?pagesize=5` shows fewer (tests), never under 5.
const PAGE_SIZE = Math.max(5, Number(new URLSearchParams(window.location.search).get("pagesize")) || 25);
const LIVE = ["running", "queued", "preempted"];
const ENDED = ["succeeded", "failed", "cancelled"];

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
  // Running for: this attempt. A requeued job says so, with its attempts' time in all.
  const earlier = job.attempt > 1 ? `attempt ${job.attempt}, ${fmtDuration(job.ran_s || 0)} in earlier ones` : "";
  return h(
    "tr",
    { "data-job-id": job.id },
    ...leadCells(job),
    h("td", { class: "num" }, fmtNumber(job.allocation.reduce((n, s) => n + s.gpu_indices.length * s.share, 0), 2)),
    h("td", { class: "mono" }, fmtAllocation(job.allocation)),
    h("td", {}, utilisationChips(job, byGpu) ?? h("span", { class: "muted" }, "n/a")),
    h("td", {}, since(job.started_at)),
    h("td", {}, job.spec.time_limit ? relative(job.started_at + job.spec.time_limit) : ""),
    h("td", {}, earlier),
  );
}

function waitingRow(job) {
  return h(
    "tr",
    { "data-job-id": job.id },
    ...leadCells(job),
    h("td", { class: "num" }, gpusLabel(job.spec)),
    h("td", {}, since(job.submitted_at)),
    h("td", {}, job.attempt > 0 ? `${fmtDuration(job.ran_s || 0)} (${job.attempt} attempt${job.attempt > 1 ? "s" : ""})` : ""),
    h("td", { class: "reason" }, job.reason),
  );
}

// An array's elements by state, as one bar (GET /v1/jobs?collapse=true gives the counts).
const BAR_STATES = ["succeeded", "failed", "cancelled", "running", "preempted", "queued"];

function arrayRow(job) {
  const counts = job.array_counts;
  const total = Object.values(counts).reduce((a, b) => a + b, 0) || 1;
  const segments = BAR_STATES.filter((s) => counts[s]).map((s) =>
    h("span", { class: `state-${s}`, "data-state": s, style: { width: `${(100 * counts[s]) / total}%` }, title: `${counts[s]} ${s}` }));
  const ended = (counts.succeeded || 0) + (counts.failed || 0) + (counts.cancelled || 0);
  return h(
    "tr",
    { "data-array-id": job.array_id },
    h("td", {}, jobLink(job.id, `${job.array_id}[]`)),
    h("td", {}, job.name),
    h("td", {}, job.spec.team),
    h("td", {}, h("div", { class: "progress", "data-testid": "array-progress" }, segments)),
    h("td", { "data-testid": "array-counts" },
      `${fmtNumber(ended, 0)} of ${fmtNumber(total, 0)} ended · `,
      BAR_STATES.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`).join(", ")),
  );
}

function endedRow(job) {
  return h(
    "tr",
    { "data-job-id": job.id },
    ...leadCells(job),
    h("td", { class: "num" }, gpusLabel(job.spec)),
    h("td", {}, relative(job.ended_at)),
    h("td", { "data-testid": "ran", title: "all attempts together" },
      job.attempt > 0 ? fmtDuration(runSeconds(job)) : "never started",
      job.attempt > 1 ? h("span", { class: "muted" }, ` (${job.attempt} attempts)`) : null),
    h("td", { class: "num" }, job.exit_code ?? ""),
    h("td", { class: "reason" }, job.reason),
  );
}

function query(states, filter, extra = "") {
  const params = new URLSearchParams();
  for (const s of states) params.append("state", s);
  if (filter.team) params.set("team", filter.team);
  if (filter.text.trim()) params.set("q", filter.text.trim());
  return `/v1/jobs?${params}${extra}`;
}

/** The filter form: built once (so typing is never interrupted by a refresh), calling `changed`. */
function filterForm(filter, changed) {
  const state = h("select", { name: "state", "aria-label": "state" },
    h("option", { value: "" }, "any state"),
    [...LIVE, ...ENDED].map((s) => h("option", { value: s }, s)));
  const team = h("select", { name: "team", "aria-label": "team" }, h("option", { value: "" }, "any team"));
  const text = h("input", { name: "q", type: "search", placeholder: "name, owner or #id", "aria-label": "search" });
  state.addEventListener("change", () => changed({ state: state.value }));
  team.addEventListener("change", () => changed({ team: team.value }));
  let typing = null;
  text.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => changed({ text: text.value }), 250); // one request per pause, not per key
  });
  const form = h("form", { class: "filters", "data-testid": "job-filter", onsubmit: (e) => e.preventDefault() },
    state, " ", team, " ", text);
  return {
    el: form,
    /** The teams the viewer may filter by (theirs; a cluster admin's: every team known). */
    setTeams(names) {
      const wanted = ["", ...names];
      if ([...team.options].map((o) => o.value).join("\n") === wanted.join("\n")) return;
      fill(team, h("option", { value: "" }, "any team"), names.map((n) => h("option", { value: n }, n)));
      team.value = filter.team;
    },
  };
}

function pager(total, offset, go) {
  const first = total ? offset + 1 : 0;
  const last = Math.min(total, offset + PAGE_SIZE);
  return h("p", { class: "pager", "data-testid": "pager" },
    h("button", { type: "button", "data-page": "newer", disabled: offset === 0, onclick: () => go(Math.max(0, offset - PAGE_SIZE)) }, "‹ newer"),
    h("span", { "data-testid": "page-range" }, ` ${fmtNumber(first, 0)}-${fmtNumber(last, 0)} of ${fmtNumber(total, 0)} `),
    h("button", { type: "button", "data-page": "older", disabled: last >= total, onclick: () => go(offset + PAGE_SIZE) }, "older ›"),
  );
}

export function jobsPage(root) {
  const filter = { state: "", team: "", text: "" };
  let offset = 0; // into the ended jobs, newest first
  let teams = null; // the viewer's teams for the filter, read once
  let generation = 0; // a refresh started before the filter changed must not draw over a newer one
  const content = h("div");
  const form = filterForm(filter, (change) => {
    Object.assign(filter, change);
    offset = 0;
    page.refresh().catch(() => {}); // at once; the next poll reports any error
  });
  fill(root, h("h1", {}, "Jobs"), form.el, content);

  async function viewerTeams() {
    if (teams === null) {
      const [me, policy] = await Promise.all([api("/v1/whoami"), api("/v1/policy")]);
      const own = me.teams.map((t) => t.team);
      teams = me.cluster_admin ? [...new Set([...policy.teams.map((t) => t.name), ...own])].sort() : own.sort();
      form.setTeams(teams);
    }
  }

  const page = {
    title: "Jobs",
    async refresh() {
      const mine = ++generation;
      await viewerTeams();
      const wanted = filter.state ? [filter.state] : null;
      const showLive = !wanted || LIVE.includes(filter.state);
      const showEnded = !wanted || ENDED.includes(filter.state);
      const [active, ended, nodes, arrays] = await Promise.all([
        showLive ? api(query(wanted ?? LIVE, filter)) : { jobs: [] },
        showEnded ? api(query(wanted ?? ENDED, filter, `&limit=${PAGE_SIZE}&offset=${offset}`)) : { jobs: [], total: 0 },
        api("/v1/nodes"),
        // Arrays with an element still to run, one entry each with its counts by state.
        showLive ? api(query(wanted ?? LIVE, filter, "&collapse=true")) : { jobs: [] },
      ]);
      if (mine !== generation) return;
      const inProgress = arrays.jobs.filter((j) => j.array_counts);
      if (showEnded && offset > 0 && offset >= ended.total) {
        offset = Math.max(0, Math.floor((ended.total - 1) / PAGE_SIZE) * PAGE_SIZE); // the list shrank
        return page.refresh();
      }
      const byGpu = new Map();
      for (const node of nodes.nodes) {
        for (const gpu of node.gpus) byGpu.set(`${node.name}/${gpu.index}`, gpuUtilisation(gpu));
      }
      const running = active.jobs.filter((j) => j.state === "running");
      const waiting = active.jobs.filter((j) => j.state !== "running");
      const newestFirst = [...ended.jobs].reverse();
      if (!unchanged(content, [filter, offset, active, ended, [...byGpu], inProgress])) {
        const goTo = (at) => {
          offset = at;
          page.refresh().catch(() => {});
        };
        const filtered = filter.state || filter.team || filter.text.trim();
        fill(content,
          filtered ? h("p", { class: "muted", "data-testid": "filter-note" }, "Only jobs matching the filter are shown.") : null,
          inProgress.length ? [
            h("h2", {}, `Arrays in progress (${inProgress.length})`),
            table(["array", "name", "team", "progress", "elements"], inProgress.map(arrayRow), { testid: "arrays" }),
          ] : null,
          showLive && (!wanted || filter.state === "running") ? [
            h("h2", {}, `Running (${running.length})`),
            table(
              ["job", "name", "team", "state", "GPUs", "where", "utilisation", "this attempt running for", "time limit ends", ""],
              running.map((j) => runningRow(j, byGpu)),
              { empty: "Nothing runs.", testid: "running" },
            ),
          ] : null,
          showLive && filter.state !== "running" ? [
            h("h2", {}, `Waiting (${waiting.length}) `, h("a", { href: "#/queue", class: "small" }, "in scheduling order")),
            table(["job", "name", "team", "state", "GPUs", "waiting", "ran before", "why"], waiting.map(waitingRow), {
              empty: "Nothing waits.",
              testid: "waiting",
            }),
          ] : null,
          showEnded ? [
            h("h2", {}, `Ended (${fmtNumber(ended.total ?? newestFirst.length, 0)}), newest first`),
            table(["job", "name", "team", "state", "GPUs", "ended", "ran", "exit", "reason"], newestFirst.map(endedRow), {
              empty: filtered ? "No ended job matches." : "No job has ended yet.",
              testid: "ended",
            }),
            (ended.total ?? 0) > PAGE_SIZE ? pager(ended.total, offset, goTo) : null,
          ] : null,
        );
      }
      tick(root);
    },
  };
  return page;
}
