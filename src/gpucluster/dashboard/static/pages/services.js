// Services (GET /v1/services): each service's replicas ready and wanted, requests per second,
// latency and errors through the gateway, GPU-hours and cost of all its replica jobs so far,
// and each replica's job, port and phase. A head
// without services (404) shows that none are served.

import { api, ApiError } from "../api.js";
import { fill, fmtNumber, h, jobLink, stateBadge, table, unchanged } from "../ui.js";

const ms = (s) => (s === null || s === undefined ? "-" : `${fmtNumber(s * 1000, 1)} ms`);

function serviceRow(s) {
  const ready = s.replicas.filter((r) => r.phase === "ready").length;
  const starting = s.replicas.filter((r) => r.phase === "starting" || r.phase === "queued").length;
  return h(
    "tr",
    { "data-service": s.name },
    h("td", {}, s.name),
    h("td", {}, s.team),
    h("td", { title: s.reason || "" }, stateBadge(s.state), s.reason ? h("span", { class: "muted" }, " ", s.reason) : null),
    h("td", { class: "num", "data-testid": "ready" }, `${ready} / ${s.desired_replicas}`),
    h("td", { class: "num" }, String(starting)),
    h("td", { class: "num" }, `${s.spec.min_replicas}..${s.spec.max_replicas}`),
    h("td", { class: "num" }, fmtNumber(s.stats.requests_per_s, 1)),
    h("td", { class: "num" }, ms(s.stats.latency_p50_s)),
    h("td", { class: "num" }, ms(s.stats.latency_p99_s)),
    h("td", { class: "num" }, `${s.stats.errors} / ${s.stats.requests}`),
    h("td", { class: "num", "data-testid": "gpu-hours" }, fmtNumber(s.usage.gpu_hours, 2)),
    h("td", { class: "num" }, fmtNumber(s.usage.cost, 2)),
    h("td", { class: "num" }, String(s.revision)),
    h("td", {}, h("code", {}, s.url_path)),
  );
}

function replicaRows(s) {
  return s.replicas.map((r) =>
    h(
      "tr",
      { "data-replica": r.id },
      h("td", {}, s.name),
      h("td", {}, r.job_id ? jobLink(r.job_id) : "-"),
      h("td", { class: "num" }, String(r.port)),
      h("td", { class: "num" }, String(r.revision)),
      h("td", {}, h("span", { class: `badge phase-${r.phase}` }, r.phase)),
      h("td", { class: "num" }, String(r.in_flight)),
    ),
  );
}

export function servicesPage(root) {
  return {
    title: "Services",
    async refresh() {
      let services;
      try {
        services = (await api("/v1/services")).services;
      } catch (e) {
        if (!(e instanceof ApiError) || e.status !== 404) throw e;
        services = [];
      }
      if (unchanged(root, services)) return;
      fill(
        root,
        h("h1", {}, `Services (${services.length})`),
        h("p", { class: "muted" }, "Replicas of a command behind the head's gateway at /serve/NAME/ ",
          "(`gpucluster serve`); each replica is a job."),
        table(
          ["name", "team", "state", "ready / wanted", "starting", "replicas", "req/s", "p50", "p99", "errors",
           "GPU-h", "cost", "rev", "path"],
          services.map(serviceRow),
          { empty: "No services.", testid: "services" },
        ),
        h("h3", {}, "Replicas"),
        table(["service", "job", "port", "rev", "phase", "in flight"], services.flatMap(replicaRows), {
          empty: "No replicas.",
          testid: "replicas",
        }),
      );
    },
  };
}
