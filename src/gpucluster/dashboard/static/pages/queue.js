// The queue in scheduling order (GET /v1/queue): why each job waits and, for the job holding the
// backfill reservation, when it is expected to start.

import { api } from "../api.js";
import { estimateAssumption, fill, gpusLabel, h, jobLink, relative, since, startWindow, stateBadge, table, tick, unchanged } from "../ui.js";

function row(entry) {
  const job = entry.job;
  const spec = job.spec;
  const backoff = job.not_before && job.not_before > Date.now() / 1000 ? relative(job.not_before) : null;
  return h(
    "tr",
    { "data-job-id": job.id },
    h("td", { class: "num" }, entry.position),
    h("td", {}, jobLink(job.id)),
    h("td", {}, job.name),
    h("td", {}, spec.team),
    h("td", {}, spec.priority),
    h("td", { class: "num" }, gpusLabel(spec)),
    h("td", {}, [spec.gpu_type].flat().filter(Boolean).join(", ") || "any"),
    h("td", {}, stateBadge(job.state)),
    h("td", {}, since(job.submitted_at)),
    h("td", { class: "reason", title: job.wait_reason || "" }, job.reason || job.wait_reason || "",
      backoff ? h("span", { class: "muted" }, " · restart ", backoff) : null),
    h("td", {}, startWindow(job)),
  );
}

export function queuePage(root) {
  return {
    title: "Queue",
    async refresh() {
      const [queue, policy] = await Promise.all([api("/v1/queue"), api("/v1/policy")]);
      if (!unchanged(root, [queue, policy.default_time_limit_s])) {
        fill(root,
          h("h1", {}, `Queue (${queue.total ?? queue.entries.length})`),
          queue.total > queue.entries.length
            ? h("p", { class: "muted", "data-testid": "queue-more" },
              `Showing the first ${queue.entries.length} of ${queue.total} queued jobs.`)
            : null,
          h("p", { class: "muted" }, "In the order the scheduler considers them. The first job that cannot start ",
            "holds a reservation, with its estimated start; later jobs may backfill around it."),
          h("p", { class: "muted", "data-testid": "estimate-assumption" },
            `Estimated starts are ${estimateAssumption(policy)}; a job that ends early makes later starts earlier.`),
          table(
            ["#", "job", "name", "team", "priority", "GPUs", "GPU type", "state", "waiting", "why it waits", "est. start"],
            queue.entries.map(row),
            { empty: "The queue is empty: every job that asked for GPUs has them.", testid: "queue" },
          ),
        );
      }
      tick(root);
    },
  };
}
