// A log that follows live: GET /v1/jobs/{id}/logs?follow=true streams the attempt's output as it
// grows and ends when the attempt is over. Bytes are counted so a dropped connection resumes at
// `offset` without repeating or losing output; only the last MAX_CHARS are kept on screen.
// All ranks at once (`followAll`): one stream per rank, whole lines prefixed `[rank N] ` as
// torchrun's --tee and `gpucluster logs --all-ranks --follow` show them.

import { api, ApiError } from "./api.js";
import { h } from "./ui.js";

const MAX_CHARS = 200_000;
const RETRY_MS = 2000;

export class LogTail {
  constructor(jobId) {
    this.jobId = jobId;
    this.pre = h("pre", { class: "log", "data-testid": "log" });
    this.note = h("p", { class: "muted", "data-testid": "log-state" });
    this.el = h("div", {}, this.note, this.pre);
    this.key = null;
    this.controllers = [];
  }

  /** Every rank of attempt `attempt` (`ranks` of them) at once, lines prefixed; a no-op if shown. */
  followAll(attempt, ranks) {
    const key = `${attempt}/all`;
    if (key === this.key) return;
    this.stop();
    this.key = key;
    this.text = "";
    this.pre.textContent = "";
    this.note.textContent = `attempt ${attempt}, all ${ranks} ranks: following…`;
    let open = ranks;
    const ended = () => {
      open -= 1;
      if (open === 0 && this.key === key) this.note.textContent = `attempt ${attempt}, all ${ranks} ranks: ended`;
    };
    for (let r = 0; r < ranks; r++) this.run(key, attempt, r, 0, `[rank ${r}] `, ended);
  }

  /** Show attempt `attempt` (rank `rank` for a distributed job); a no-op if already shown. */
  follow(attempt, rank) {
    const key = `${attempt}/${rank ?? ""}`;
    if (key === this.key) return;
    this.stop();
    this.key = key;
    this.text = "";
    this.pre.textContent = "";
    if (!attempt) {
      this.note.textContent = "The job has not started yet; its output appears here when it does.";
      return;
    }
    this.note.textContent = `attempt ${attempt}${rank !== null ? `, rank ${rank}` : ""}: following…`;
    this.run(key, attempt, rank, 0);
  }

  async run(key, attempt, rank, offset, prefix = null, ended = null, partial = { text: "" }) {
    const controller = new AbortController();
    this.controllers.push(controller);
    const put = (chunk) => {
      if (prefix === null) return this.append(chunk);
      const lines = (partial.text + chunk).split("\n");
      partial.text = lines.pop();
      if (lines.length) this.append(lines.map((l) => `${prefix}${l}\n`).join(""));
    };
    const params = new URLSearchParams({ follow: "true", offset: String(offset), attempt: String(attempt) });
    if (rank !== null) params.set("rank", String(rank));
    let bytes = offset;
    try {
      const response = await api(`/v1/jobs/${this.jobId}/logs?${params}`, { raw: true, signal: controller.signal });
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        bytes += value.byteLength;
        put(decoder.decode(value, { stream: true }));
      }
      put(decoder.decode());
      if (prefix !== null && partial.text) put("\n");
      if (ended) ended();
      else if (this.key === key) this.note.textContent = `attempt ${attempt}${rank !== null ? `, rank ${rank}` : ""}: ended`;
    } catch (e) {
      if (e.name === "AbortError" || this.key !== key) return;
      if (e instanceof ApiError && e.status >= 400 && e.status < 500) {
        this.note.textContent = `log: ${e.message}`; // asking again would get the same answer
        return;
      }
      this.note.textContent = `log: ${e.message}; retrying…`;
      setTimeout(() => {
        if (this.key === key) this.run(key, attempt, rank, bytes, prefix, ended, partial);
      }, RETRY_MS);
    }
  }

  append(chunk) {
    if (!chunk) return;
    const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
    this.text += chunk;
    if (this.text.length > MAX_CHARS) {
      const cut = this.text.indexOf("\n", this.text.length - MAX_CHARS);
      this.text = `…\n${this.text.slice(cut >= 0 ? cut + 1 : this.text.length - MAX_CHARS)}`;
    }
    this.pre.textContent = this.text;
    if (atBottom) this.pre.scrollTop = this.pre.scrollHeight;
  }

  stop() {
    this.key = null;
    for (const c of this.controllers) c.abort();
    this.controllers = [];
  }
}
