// The step graph: recorded steps as nodes (status, duration, errors), the
// part of the body not reached yet as dashed nodes, parallel branches as
// lanes side by side, loops and if/try blocks as frames around what they
// decide. A node that starts a child run or waits for one names the child
// and links to its page; a loop whose every iteration is one node (a
// fan-out of starts, a fan-in of waits) lays its iterations out side by
// side. A long history comes summarised: a loop's iterations, a fork's
// branches or a row of steps past fifty are cut to their first and last
// ten around a box that counts the rest. The shapes come from the server
// (everystep.graph.drawn, everystep.graph.collapse).

import { runHref } from "./api.js";
import { ago, h, seconds, shortId, statusBadge, when } from "./dom.js";

const STATE_TEXT = {
  done: "done", failed: "failed", started: "uncertain", pending: "not reached yet",
  skipped: "not reached", diverged: "code diverged", running: "in flight", waiting: "waiting",
};


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
    case "patch": return patchNode(node, path, ctx);
    case "collapsed": return collapsedBox(node, "steps");
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
  copiedTag(node),
  meta.length ? h("span", { class: "node-meta", text: meta.join(" · ") }) : null,
  error ? h("span", { class: "node-error", text: error }) : null);
  return withChild(el, node);
}

// A fork's copy of its source's record: replayed, never run by the fork.
function copiedTag(node) {
  return node.copied ? h("span", { class: "tag copied", title: "copied from the run this one was forked from",
                                   text: "copied" }) : null;
}

function workflowShort(name) {
  return name ? name.slice(name.lastIndexOf(".") + 1) : "";
}

// The child run a node started or waits for: a link to its page, beside
// the node (a link cannot sit inside the node's button).
function withChild(el, node) {
  const child = node.child;
  if (!child) return el;
  return h("div", { class: "node-with-child" }, el,
    h("a", { class: "child-link", href: runHref(child.id), title: `child run ${child.id}${child.name ? ` (${child.name})` : ""}`,
             dataset: { child: child.id } },
      h("span", { class: "mono", text: `child ${shortId(child.id)}` }),
      child.name ? h("span", { class: "child-workflow", text: workflowShort(child.name) }) : null,
      child.status ? statusBadge(child.status) : null));
}

// A wait (a durable sleep, …): what it waits for and until when. It is
// the engine's, not a step of the user's, so it is drawn apart.
function waitNode(node, path, ctx) {
  const key = nodeKey(node, path);
  const record = node.record;
  // What it waits for, in the words of its kind's declaration (the API's
  // ``what``); a child is named by its workflow.
  const childName = node.wait === "child" && node.child ? workflowShort(node.child.name) || shortId(node.child.id) : null;
  const what = childName ? `child ${childName}` : (node.what || node.wait);
  const meta = [];
  if (node.until) {
    meta.push(node.state === "waiting" ? `wakes ${ago(node.until)}, ${when(node.until)}` : `until ${when(node.until)}`);
  } else if (node.state === "waiting") {
    meta.push("waiting");
  }
  if (node.state === "done" && record && record.duration !== null && record.duration !== undefined) {
    meta.push(`waited ${seconds(record.duration)}`);
  }
  const el = h("button", {
    type: "button",
    class: `node wait wait-${node.wait} state-${node.state}${key === ctx.selected ? " selected" : ""}`,
    title: `${what}${node.id ? ` · step ${node.id}` : ""} · ${STATE_TEXT[node.state] || node.state}`,
    dataset: { key, state: node.state, step: node.id || "", wait: node.wait },
    onclick: () => ctx.onSelect(node, key),
  },
  h("span", { class: "node-id", text: node.id || (node.state === "skipped" ? "–" : "?") }),
  h("span", { class: "node-label" }, h("span", { class: "wait-kind", text: what }), " ",
    h("code", { class: "wait-call", text: node.label })),
  copiedTag(node),
  meta.length ? h("span", { class: "node-meta", text: meta.join(" · ") }) : null);
  return withChild(el, node);
}

// patched(id): the branch this run takes, recorded once (new code or old).
function patchNode(node, path, ctx) {
  const key = nodeKey(node, path);
  const answer = node.answer === true ? "new code" : node.answer === false ? "old code" : "not asked yet";
  return h("button", {
    type: "button",
    class: `node patch state-${node.state}${key === ctx.selected ? " selected" : ""}`,
    title: `patch ${node.patch || "?"}: ${answer}`,
    dataset: { key, state: node.state, step: node.id || "", patch: node.patch || "", answer: String(node.answer) },
    onclick: () => ctx.onSelect(node, key),
  },
  h("span", { class: "node-id", text: "patch" }),
  h("span", { class: "node-label" }, h("code", { text: node.label }), " → ", h("span", { class: "patch-answer", text: answer })),
  copiedTag(node));
}

// What a long history's summary holds: how many iterations, branches or
// steps are not drawn, their records by state and by function, and the
// first and last of their step ids.
function collapsedBox(summary, what) {
  const count = (n) => Number(n).toLocaleString("en");
  const states = Object.entries(summary.states).map(([state, n]) => `${count(n)} ${STATE_TEXT[state] || state}`);
  const functions = summary.functions.slice(0, 4).map(([label, n]) => `${label} × ${count(n)}`);
  if (summary.functions.length > 4) functions.push(`${summary.functions.length - 4} more`);
  return h("div", { class: "collapsed", dataset: { count: String(summary.count), steps: String(summary.steps) } },
    h("span", { class: "collapsed-count", text: `${count(summary.count)} ${what} not drawn` }),
    h("span", { class: "collapsed-states", text: `${count(summary.steps)} recorded step${summary.steps === 1 ? "" : "s"}${states.length ? `: ${states.join(", ")}` : ""}` }),
    functions.length ? h("span", { class: "collapsed-functions", text: functions.join(" · ") }) : null,
    summary.first ? h("span", { class: "hint mono", text: summary.first === summary.last ? `step ${summary.first}`
      : `steps ${summary.first} … ${summary.last}` }) : null);
}

function lanes(list, path, ctx, cls, collapsed) {
  const row = h("div", { class: `lanes ${cls || ""}` });
  list.forEach((lane, index) => {
    if (collapsed && index === collapsed.after) row.append(h("div", { class: "lane" }, collapsedBox(collapsed, "branches")));
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
    lanes(node.lanes, path, ctx, "fork-lanes", node.collapsed));
}

// One node per iteration: a fan-out (starts) or a fan-in (waits, each in
// its try), drawn as a grid of iterations rather than a long column.
function isFan(node) {
  const single = (nodes) => nodes.length === 1 && ["step", "wait", "try"].includes(nodes[0].kind);
  return node.iterations.length > 1 && node.iterations.every(single) && (!node.next || !node.next.length || single(node.next));
}

function loopNode(node, path, ctx) {
  const fan = isFan(node);
  const collapsed = node.collapsed;
  const total = node.count ?? node.iterations.length;
  const el = h("div", { class: `block loop${fan ? " fan" : ""}`, dataset: { iterations: String(total) } },
    h("div", { class: "block-head" }, h("span", { class: "block-kind", text: "loop" }), h("code", { text: node.label }),
      fan || collapsed ? h("span", { class: "hint", text: `${Number(total).toLocaleString("en")} iterations` }) : null));
  const holder = fan ? h("div", { class: "iterations" }) : el;
  if (fan) el.append(holder);
  node.iterations.forEach((iteration, index) => {
    if (collapsed && index === collapsed.after) holder.append(collapsedBox(collapsed, "iterations"));
    // The iterations after a collapsed run keep their numbers.
    const number = collapsed && index >= collapsed.after ? index + collapsed.count + 1 : index + 1;
    // In a grid the node's own id says the order: the label is a tooltip.
    const box = h("div", { class: "iteration", title: `iteration ${number}` },
      fan ? null : h("div", { class: "lane-label", text: `iteration ${number}` }));
    renderNodes(box, iteration, `${path}.i${index}`, ctx);
    holder.append(box);
  });
  if (node.next && node.next.length) {
    const more = node.remaining;
    const label = !node.iterations.length ? "each iteration"
      : more > 1 ? `next iteration (${more} still to come)` : more === 1 ? "next iteration (the last)" : "next iteration, if any";
    const box = h("div", { class: "iteration upcoming" }, h("div", { class: "lane-label", text: label }));
    renderNodes(box, node.next, `${path}.next`, ctx);
    holder.append(box);
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
      if (["step", "wait", "patch"].includes(node.kind) && nodeKey(node, here) === key) found = node;
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
