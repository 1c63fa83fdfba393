// The step graph: recorded steps as nodes (status, duration, errors), the
// part of the body not reached yet as dashed nodes, parallel branches as
// lanes side by side, loops and if/try blocks as frames around what they
// decide. The shapes come from the server (everystep.graph.overlay).

import { ago, h, seconds, shortId, when } from "./dom.js";

const STATE_TEXT = {
  done: "done", failed: "failed", started: "uncertain", pending: "not reached yet",
  skipped: "not reached", diverged: "code diverged", running: "in flight", waiting: "waiting",
};

// What each kind of wait (everystep.graph.plan.waits) is called on its node.
const WAIT_TEXT = { sleep: "sleep", message: "message", child: "child" };

export function nodeKey(node, path) {
  return node.id ? `id:${node.id}` : `path:${path}`;
}

export function renderGraph(graph, options) {
  const { selected, onSelect } = options;
  const container = h("div", { class: `graph graph-${graph.mode}` });
  if (graph.mode === "recorded") {
    container.append(h("p", { class: "notice" }, "Drawn from the recorded steps only: ", h("span", { text: graph.reason })));
  }
  for (const note of graph.notes || []) container.append(h("p", { class: "notice subtle", text: note }));
  const flow = h("div", { class: "flow" });
  renderNodes(flow, graph.nodes, "n", { selected, onSelect });
  if (!graph.nodes.length) flow.append(h("p", { class: "empty", text: "no steps yet" }));
  container.append(flow);
  if (graph.unplaced && graph.unplaced.length) {
    const extra = h("div", { class: "flow" });
    renderNodes(extra, graph.unplaced, "u", { selected, onSelect });
    container.append(h("section", { class: "unplaced" },
      h("h4", { text: "Recorded steps the source graph does not place" }),
      h("p", { class: "hint", text: "the body's control flow could not be followed this far from its source" }), extra));
  }
  if (graph.file) {
    container.append(h("p", { class: "hint source", text: `source: ${graph.file}${graph.line ? `:${graph.line}` : ""}` }));
  }
  return container;
}

function renderNodes(parent, nodes, path, ctx) {
  nodes.forEach((node, index) => {
    const here = `${path}.${index}`;
    const el = renderNode(node, here, ctx);
    if (el) parent.append(el);
  });
}

function renderNode(node, path, ctx) {
  switch (node.kind) {
    case "step": return stepNode(node, path, ctx);
    case "wait": return waitNode(node, path, ctx);
    case "fork": return forkNode(node, path, ctx);
    case "loop": return loopNode(node, path, ctx);
    case "choice": return choiceNode(node, path, ctx);
    case "try": return tryNode(node, path, ctx);
    case "exit": return h("div", { class: "exit", text: node.label });
    default: return null;
  }
}

function stepNode(node, path, ctx) {
  const key = nodeKey(node, path);
  const record = node.record;
  const meta = [];
  if (record && record.duration !== null && record.duration !== undefined) meta.push(seconds(record.duration));
  if (node.in_flight) meta.push("in flight");
  if (node.child) meta.push(`child ${shortId(node.child.id)} · ${node.child.status}`);
  if (node.state === "started") meta.push("effect uncertain");
  if (node.state === "diverged") meta.push(`now calls ${node.expected}`);
  const error = record && record.error ? `${record.error.type}: ${record.error.message}` : null;
  const el = h("button", {
    type: "button",
    class: `node state-${node.state}${key === ctx.selected ? " selected" : ""}${node.unsafe ? " unsafe" : ""}`,
    title: `${node.function}${node.id ? ` · step ${node.id}` : ""} · ${STATE_TEXT[node.state] || node.state}`,
    dataset: { key, state: node.state, step: node.id || "" },
    onclick: () => ctx.onSelect(node, key),
  },
  // A step not reached whose id depends on the path taken has none to show.
  h("span", { class: "node-id", text: node.id || (node.state === "skipped" ? "–" : "?") }),
  h("span", { class: "node-label", text: node.label }),
  node.unsafe ? h("span", { class: "tag", text: "unsafe" }) : null,
  node.exactly_once ? h("span", { class: "tag", text: "exactly once" }) : null,
  meta.length ? h("span", { class: "node-meta", text: meta.join(" · ") }) : null,
  error ? h("span", { class: "node-error", text: error }) : null);
  return el;
}

// A wait (a durable sleep, …): what it waits for and until when. It is
// the engine's, not a step of the user's, so it is drawn apart.
function waitNode(node, path, ctx) {
  const key = nodeKey(node, path);
  const record = node.record;
  const topic = node.wait === "message" && record && Array.isArray(record.args) ? record.args[0] : null;
  const what = topic ? `message "${topic}"` : (WAIT_TEXT[node.wait] || node.wait);
  const meta = [];
  if (node.until) {
    meta.push(node.state === "waiting" ? `wakes ${ago(node.until)}, ${when(node.until)}` : `until ${when(node.until)}`);
  } else if (node.state === "waiting") {
    meta.push("waiting");
  }
  if (node.state === "done" && record && record.duration !== null && record.duration !== undefined) {
    meta.push(`waited ${seconds(record.duration)}`);
  }
  return h("button", {
    type: "button",
    class: `node wait wait-${node.wait} state-${node.state}${key === ctx.selected ? " selected" : ""}`,
    title: `${what}${node.id ? ` · step ${node.id}` : ""} · ${STATE_TEXT[node.state] || node.state}`,
    dataset: { key, state: node.state, step: node.id || "", wait: node.wait },
    onclick: () => ctx.onSelect(node, key),
  },
  h("span", { class: "node-id", text: node.id || (node.state === "skipped" ? "–" : "?") }),
  h("span", { class: "node-label" }, h("span", { class: "wait-kind", text: what }), " ",
    h("code", { class: "wait-call", text: node.label })),
  meta.length ? h("span", { class: "node-meta", text: meta.join(" · ") }) : null);
}

function lanes(list, path, ctx, cls) {
  const row = h("div", { class: `lanes ${cls || ""}` });
  list.forEach((lane, index) => {
    const column = h("div", { class: `lane${lane.taken ? " taken" : ""}` },
      h("div", { class: "lane-label", text: lane.label }));
    renderNodes(column, lane.nodes, `${path}.${index}`, ctx);
    if (!lane.nodes.length) column.append(h("div", { class: "lane-empty", text: "no steps" }));
    row.append(column);
  });
  return row;
}

function forkNode(node, path, ctx) {
  return h("div", { class: `block fork state-${node.state}` },
    h("div", { class: "block-head" },
      h("span", { class: "block-kind", text: "parallel" }),
      node.label !== "parallel" ? h("span", { class: "block-name", text: node.label }) : null,
      node.id !== node.label ? h("span", { class: "node-id", text: node.id || "?" }) : null,
      node.dynamic ? h("span", { class: "tag", text: "branches built at run time" }) : null),
    lanes(node.lanes, path, ctx, "fork-lanes"));
}

function loopNode(node, path, ctx) {
  const el = h("div", { class: "block loop" },
    h("div", { class: "block-head" }, h("span", { class: "block-kind", text: "loop" }), h("code", { text: node.label })));
  node.iterations.forEach((iteration, index) => {
    const box = h("div", { class: "iteration" }, h("div", { class: "lane-label", text: `iteration ${index + 1}` }));
    renderNodes(box, iteration, `${path}.i${index}`, ctx);
    el.append(box);
  });
  if (node.next && node.next.length) {
    const box = h("div", { class: "iteration upcoming" },
      h("div", { class: "lane-label", text: node.iterations.length ? "next iteration, if any" : "each iteration" }));
    renderNodes(box, node.next, `${path}.next`, ctx);
    el.append(box);
  }
  return el;
}

function choiceNode(node, path, ctx) {
  if (node.decided) {
    const taken = node.lanes.findIndex((lane) => lane.taken);
    const others = node.lanes.filter((lane) => !lane.taken).map((lane) => lane.label);
    const el = h("div", { class: "block choice decided" },
      h("div", { class: "block-head" }, h("span", { class: "block-kind", text: "branch" }),
        h("code", { text: node.lanes[taken].label }),
        others.length ? h("span", { class: "hint", text: `not taken: ${others.join(", ")}` }) : null));
    renderNodes(el, node.lanes[taken].nodes, `${path}.${taken}`, ctx);
    return el;
  }
  return h("div", { class: `block choice${node.passed ? " passed" : ""}` },
    h("div", { class: "block-head" }, h("span", { class: "block-kind", text: "one of" }),
      node.passed ? h("span", { class: "hint", text: "passed without recording a step" }) : null),
    lanes(node.lanes, path, ctx, "choice-lanes"));
}

function tryNode(node, path, ctx) {
  const el = h("div", { class: "block try" },
    h("div", { class: "block-head" }, h("span", { class: "block-kind", text: "try" }),
      node.caught ? h("span", { class: "hint", text: `caught by ${node.caught}` }) : null));
  const body = h("div", { class: "try-body" });
  renderNodes(body, node.body, `${path}.b`, ctx);
  el.append(body);
  if (node.handlers.length) el.append(lanes(node.handlers, `${path}.h`, ctx, "handlers"));
  if (node.orelse.length) {
    const box = h("div", { class: "try-part" }, h("div", { class: "lane-label", text: "else" }));
    renderNodes(box, node.orelse, `${path}.e`, ctx);
    el.append(box);
  }
  if (node.final.length) {
    const box = h("div", { class: "try-part" }, h("div", { class: "lane-label", text: "finally" }));
    renderNodes(box, node.final, `${path}.f`, ctx);
    el.append(box);
  }
  return el;
}

// Every step node of a graph, with its key, to find the selected one again
// after an update.
export function findNode(graph, key) {
  let found = null;
  const visit = (nodes, path) => {
    nodes.forEach((node, index) => {
      const here = `${path}.${index}`;
      if (found) return;
      if ((node.kind === "step" || node.kind === "wait") && nodeKey(node, here) === key) found = node;
      for (const [i, lane] of (node.lanes || []).entries()) visit(lane.nodes, `${here}.${i}`);
      for (const [i, lane] of (node.handlers || []).entries()) visit(lane.nodes, `${here}.h.${i}`);
      (node.iterations || []).forEach((iteration, i) => visit(iteration, `${here}.i${i}`));
      if (node.next) visit(node.next, `${here}.next`);
      if (node.body) visit(node.body, `${here}.b`);
      if (node.orelse) visit(node.orelse, `${here}.e`);
      if (node.final) visit(node.final, `${here}.f`);
    });
  };
  visit(graph.nodes, "n");
  if (!found) visit(graph.unplaced || [], "u");
  return found;
}
