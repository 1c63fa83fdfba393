// A run's streams (everystep.write_stream) as live logs: one box per key,
// each fed by its own server-sent events (GET /api/runs/<id>/streams/<key>),
// one line per value as it comes. The browser's EventSource reconnects by
// itself and sends the last position it saw (Last-Event-ID), so a line is
// never shown twice; the server's `end` event (the stream closed, or the
// run ended) closes it for good. Where the server does not stream (a
// Django project under WSGI) the box says how to read it instead.

import { root } from "./api.js";
import { h, replace } from "./dom.js";

const streaming = document.body.dataset.stream !== "off";
// Lines kept per box: a long stream shows its tail.
const KEEP = 2000;

export class StreamLogs {
  constructor(runId) {
    this.runId = runId;
    this.element = h("div", { class: "streams" });
    this.boxes = new Map();
  }

  // The run's streams as the run view lists them: open a box for each new key.
  update(streams) {
    for (const stream of streams || []) {
      if (!this.boxes.has(stream.key)) this.open(stream.key);
    }
    if (this.boxes.size && !this.element.firstChild) {
      replace(this.element, h("h3", { text: "Streams" }), [...this.boxes.values()].map((box) => box.section));
    }
  }

  open(key) {
    const log = h("pre", { class: "stream-log", dataset: { stream: key }, "aria-live": "polite" });
    const state = h("span", { class: "stream-state", text: streaming ? "connecting…" : "" });
    const section = h("section", { class: "data stream", dataset: { key } },
      h("h4", {}, h("code", { text: key }), " ", state), log);
    const box = { section, log, state, source: null, lines: 0 };
    this.boxes.set(key, box);
    if (this.element.firstChild) this.element.append(section);
    if (!streaming) {
      state.textContent = `read it with: everystep stream ${this.runId} ${key} --follow`;
      return;
    }
    const source = new EventSource(`${root}/api/runs/${encodeURIComponent(this.runId)}/streams/${encodeURIComponent(key)}`);
    box.source = source;
    source.addEventListener("open", () => { state.textContent = "live"; });
    source.addEventListener("value", (event) => {
      const value = JSON.parse(event.data);
      const line = typeof value === "string" ? value : JSON.stringify(value);
      log.append(h("span", { class: "stream-line", dataset: { seq: event.lastEventId }, text: `${line}\n` }));
      box.lines += 1;
      if (box.lines > KEEP) { log.firstChild.remove(); box.lines -= 1; }
      log.scrollTop = log.scrollHeight;
    });
    source.addEventListener("end", () => {
      state.textContent = "ended";
      section.dataset.ended = "yes";
      source.close();
    });
    source.addEventListener("error", () => {
      if (section.dataset.ended !== "yes") state.textContent = "reconnecting…";
    });
  }

  close() {
    for (const box of this.boxes.values()) if (box.source) box.source.close();
  }
}
