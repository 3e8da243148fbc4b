// Small DOM and formatting helpers. Everything from the API goes in as text (textContent), never
// as HTML, so a job name or a log line cannot inject markup.

/** h("div", {class: "x", onclick: fn}, child, "text", [more]) -> element. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style" && typeof value === "object") Object.assign(el.style, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function link(href, ...children) {
  return h("a", { href }, ...children);
}

export function jobLink(id, label) {
  return link(`#/jobs/${id}`, label ?? `#${id}`);
}

export function stateBadge(state) {
  return h("span", { class: `badge state-${state}`, "data-state": state }, state);
}

export function table(headers, rows, { empty = "nothing here", testid } = {}) {
  if (!rows.length) return h("p", { class: "empty", "data-testid": testid }, empty);
  return h(
    "table",
    { "data-testid": testid },
    h("thead", {}, h("tr", {}, headers.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows),
  );
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`;
}

/** Seconds a job has run, all attempts together: the API's `ran_s` (its ended attempts) plus the
 * current attempt while it runs. Never ended_at - started_at: for a requeued job that counts the
 * time it waited in the queue between attempts. */
export function runSeconds(job) {
  const current = job.state === "running" && job.started_at ? Math.max(0, Date.now() / 1000 - job.started_at) : 0;
  return (job.ran_s || 0) + current;
}

/** A limit as people write it: "1h", "90m", "2h30m", "45s" (not fmtDuration's "1h00m"). */
export function fmtLimit(seconds) {
  if (!Number.isFinite(seconds) || seconds <= 0) return "";
  const units = [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]];
  let left = Math.round(seconds);
  let out = "";
  for (const [size, unit] of units) {
    if (left >= size) {
      out += `${Math.floor(left / size)}${unit}`;
      left %= size;
    }
  }
  return out;
}

/** What every start estimate assumes, said next to it, as the CLI does (`gpucluster why`). */
export function estimateAssumption(policy) {
  const limit = policy && Number.isFinite(policy.default_time_limit_s) ? fmtLimit(policy.default_time_limit_s) : "";
  return `assuming jobs run as long as similar finished jobs did, else their whole time limit, the default ${limit || "of the policy"} where none is set`;
}

export function fmtTime(unix) {
  if (!unix) return "";
  const d = new Date(unix * 1000);
  const today = new Date();
  const sameDay = d.toDateString() === today.toDateString();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return sameDay ? time : `${d.toLocaleDateString()} ${time}`;
}

/** "in 3m" / "3m ago", from a Unix time. */
export function fmtRelative(unix) {
  if (!unix) return "";
  const delta = unix - Date.now() / 1000;
  return delta >= 0 ? `in ${fmtDuration(delta)}` : `${fmtDuration(-delta)} ago`;
}

export function fmtNumber(value, digits = 1) {
  if (value === null || value === undefined || !Number.isFinite(Number(value))) return "";
  return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits });
}

export function fmtMemory(mb) {
  if (!mb) return "";
  return mb >= 1024 ? `${fmtNumber(mb / 1024, 0)} GiB` : `${fmtNumber(mb, 0)} MiB`;
}

/** Where a job runs: "node0:0,1 node1:0,1"; a fraction adds its share. */
export function fmtAllocation(slices) {
  return (slices || [])
    .map((s) => `${s.node}:${s.gpu_indices.join(",")}${s.share < 1 ? ` (${Math.round(s.share * 100)}%)` : ""}`)
    .join(" ");
}

/** A stable colour per job id, so a job's GPUs read as one block in the grid. */
export function jobColour(id) {
  const hue = (id * 137.508) % 360;
  return `hsl(${hue.toFixed(0)} 55% 62%)`;
}

/** Utilisation 0-100 -> a colour from cool (idle) to hot (busy). */
export function utilColour(pct) {
  const p = Math.max(0, Math.min(100, pct)) / 100;
  const hue = 210 - 180 * p; // blue -> orange
  return `hsl(${hue.toFixed(0)} ${(45 + 30 * p).toFixed(0)}% ${(80 - 30 * p).toFixed(0)}%)`;
}

const rendered = new WeakMap();

/** True when `el` was last rendered from the same data: callers skip the rebuild, so hover
 * tooltips, text selection and scroll positions survive a poll that changed nothing. */
export function unchanged(el, data) {
  const key = JSON.stringify(data);
  if (rendered.get(el) === key) return true;
  rendered.set(el, key);
  return false;
}

/** A cell showing the time since `unix` ("3m12s"), kept current by tick() between rebuilds. */
export function since(unix) {
  return h("span", { "data-since": unix }, unix ? fmtDuration(Date.now() / 1000 - unix) : "");
}

/** A cell showing a Unix time relative to now ("in 3m", "2m ago"), with the clock time on hover. */
export function relative(unix) {
  if (!unix) return h("span", {}, "");
  return h("span", { "data-at": unix, title: fmtTime(unix) }, fmtRelative(unix));
}

/** "starts ~14:20 (13:50-15:10)": an estimated start, relative, with its 80% interval when the
 * head has one (issue 24); the interval's ends carry their date only off the estimate's day. */
export function startWindow(job) {
  if (!job.estimated_start) return h("span", {}, "");
  const hm = (unix) => {
    const d = new Date(unix * 1000);
    const same = d.toDateString() === new Date(job.estimated_start * 1000).toDateString();
    const clock = d.toTimeString().slice(0, 5);
    return same ? clock : `${d.toISOString().slice(0, 10)} ${clock}`;
  };
  const interval = job.start_low != null && job.start_high != null
    ? h("span", { class: "muted", "data-testid": "start-interval", title: "80% likely between" },
      ` (${hm(job.start_low)}-${hm(job.start_high)})`)
    : null;
  return h("span", {}, "~", relative(job.estimated_start), interval);
}

/** Bring every since()/relative() cell under `root` up to date. */
export function tick(root) {
  const now = Date.now() / 1000;
  for (const el of root.querySelectorAll("[data-since]")) {
    el.textContent = fmtDuration(now - Number(el.dataset.since));
  }
  for (const el of root.querySelectorAll("[data-at]")) el.textContent = fmtRelative(Number(el.dataset.at));
}

/** '2', '0.25', or '4..8' for an elastic job: the spec's GPUs as the CLI writes them. */
export function gpusLabel(spec) {
  if (spec.min_gpus) return `${spec.min_gpus}..${spec.gpus}`;
  if (spec.gpu_memory) return `${fmtNumber(spec.gpus, 2)} (${spec.gpu_memory})`;
  return fmtNumber(spec.gpus, 2);
}

/** el.replaceChildren without the DOM's habit of writing "null" for a missing part. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}
