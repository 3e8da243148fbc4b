// A log that follows live: GET /v1/jobs/{id}/logs?follow=true streams the attempt's output as it
// grows and ends when the attempt is over. Bytes are counted so a dropped connection resumes at
// `offset` without repeating or losing output; only the last MAX_CHARS are kept on screen.

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
    this.controller = null;
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

  async run(key, attempt, rank, offset) {
    const controller = new AbortController();
    this.controller = controller;
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
        this.append(decoder.decode(value, { stream: true }));
      }
      this.append(decoder.decode());
      if (this.key === key) this.note.textContent = `attempt ${attempt}${rank !== null ? `, rank ${rank}` : ""}: ended`;
    } catch (e) {
      if (e.name === "AbortError" || this.key !== key) return;
      if (e instanceof ApiError && e.status >= 400 && e.status < 500) {
        this.note.textContent = `log: ${e.message}`; // asking again would get the same answer
        return;
      }
      this.note.textContent = `log: ${e.message}; retrying…`;
      setTimeout(() => {
        if (this.key === key) this.run(key, attempt, rank, bytes);
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
    if (this.controller) this.controller.abort();
    this.controller = null;
  }
}
