// One run: its status and timings (and what a scheduled run waits for),
// check-deploy's verdict, the step graph with a panel for the selected node
// (where an uncertain step is resolved; a retried step lists its attempts),
// arguments, result, error with traceback, and the recorded steps: the
// first page with the run, more a page at a time on demand (a long run's
// history is never sent whole).

import { runAction, resolveForm, commandLine } from "./actions.js";
import { Live, get, href, mayOperate, runHref } from "./api.js";
import { h, pretty, replace, seconds, statusBadge, timeCell, when } from "./dom.js";
import { findNode, nodeKey, renderGraph } from "./graph.js";
import { StreamLogs } from "./streams.js";

const VERDICT_TEXT = {
  resumes: "resumes with the loaded code", completes: "would complete with the loaded code",
  blocked: "stays blocked until resolved", stops: "replays its recorded stop",
  code_error: "would fail: the code diverged from its records", missing: "would fail: its workflow is gone",
  fails: "would fail on replay", timeout: "replay did not stop in time",
};

function initialSelection() {
  const match = /(?:^#|&)step=([^&]+)/.exec(window.location.hash);
  return match ? `id:${decodeURIComponent(match[1])}` : null;
}

function jsonBlock(title, value, cls) {
  return h("section", { class: `data ${cls || ""}` }, h("h3", { text: title }),
    h("pre", { class: "json", text: pretty(value) }));
}

export function errorBlock(error, title = "Error") {
  if (!error) return null;
  const parts = [h("h3", { text: title }),
    h("p", { class: "error-line" }, h("span", { class: "error-type", text: error.type || "?" }), ": ",
      h("span", { class: "error-message", text: error.message || "" }))];
  for (const inner of error.exceptions || []) {
    parts.push(h("div", { class: "error-inner" }, errorBlock(inner, "In a branch")));
  }
  if (error.traceback) parts.push(h("pre", { class: "traceback", text: error.traceback }));
  return h("section", { class: "data error" }, parts);
}

// The failed attempts of a retried step, oldest first.
function attemptsBlock(attempts) {
  return h("section", { class: "data attempts" }, h("h3", { text: "Retried attempts" }),
    h("table", { class: "attempts" },
      h("thead", {}, h("tr", {}, ["Attempt", "Failed", "Error", "Next attempt"].map((text) => h("th", { text })))),
      h("tbody", {}, attempts.map((attempt) => h("tr", { dataset: { attempt: String(attempt.attempt) } },
        h("td", { text: String(attempt.attempt) }),
        h("td", { text: when(attempt.failed_at) }),
        h("td", { class: "error-cell", text: attempt.error ? `${attempt.error.type}: ${attempt.error.message}` : "" }),
        h("td", { text: when(attempt.retry_at) }))))));
}

// Steps fetched per "more steps".
const STEPS_PAGE = 100;

export function runPage(main, runId) {
  let data = null;
  let selected = initialSelection();
  let panelShown = null;
  // Steps fetched past the first page, and the cursor after them.
  let more = [];
  let moreNext = null;

  const head = h("div", { class: "page-head run-head" });
  const verdictBox = h("div", { class: "verdict-box" });
  const uncertainBox = h("div", { class: "uncertain-box" });
  const summary = h("dl", { class: "summary" });
  const graphBox = h("div", { class: "graph-box" });
  const panel = h("aside", { class: "panel", "aria-label": "selected step" });
  const details = h("div", { class: "details" });
  const steps = h("table", { class: "steps" });
  const stepsFoot = h("div", { class: "steps-foot" });
  const family = h("div", { class: "family" });
  const streamLogs = new StreamLogs(runId);
  const sendBox = h("div", { class: "send-box" });
  const problem = h("p", { class: "problem", role: "alert", hidden: true });
  replace(main, head, problem, verdictBox, uncertainBox, summary,
    h("section", { class: "graph-section" }, h("h2", { text: "Steps" }),
      h("div", { class: "graph-layout" }, graphBox, panel)),
    details, streamLogs.element, family, sendBox, h("section", {}, h("h2", { text: "Recorded steps" }), h("div", { class: "table-scroll" }, steps),
      stepsFoot));

  const live = new Live("run", { id: runId }, render, (message) => {
    problem.hidden = false;
    problem.textContent = message;
  });

  function select(node, key) {
    selected = key;
    panelShown = null;
    render(data);
  }

  function renderHead() {
    const run = data.run;
    const offered = mayOperate ? data.actions : [];
    const buttons = offered.filter((action) => action.name !== "resolve").map((action) =>
      h("button", { type: "button", class: `action action-${action.name}`, title: action.help, text: action.label,
                    dataset: { action: action.name },
                    onclick: () => onAction(run, action) }));
    replace(head,
      h("h1", {}, "Run ", h("span", { class: "mono", text: run.id })),
      h("div", { class: "run-title" }, statusBadge(run.status), h("span", { class: "workflow", text: run.name }),
        run.waiting ? h("span", { class: "waiting", text: run.waiting }) : null),
      h("div", { class: "actions" }, buttons));
  }

  function onAction(run, action) {
    if (action.name === "kill") return runAction(run.id, action, { requeue: false });
    if (action.name === "fork") {
      // An unfinished run's fork is a second live run: the server says so
      // in the confirmation, and the fork is sent forced once confirmed.
      if (action.confirm && !window.confirm(action.confirm)) return null;
      const failed = data.steps.find((step) => step.status === "failed");
      const step = window.prompt("Fork from step (its id): the steps before it are copied, it and the rest run "
                                 + "with the code deployed now", failed ? failed.step_id : "");
      return step ? runAction(run.id, { ...action, confirm: null }, { step, force: Boolean(action.confirm) }) : null;
    }
    return runAction(run.id, action, {});
  }

  function renderVerdict() {
    const verdict = data.verdict;
    if (!verdict) { replace(verdictBox); return; }
    const problemClass = verdict.problem ? " bad" : verdict.outcome ? " good" : "";
    replace(verdictBox, h("div", { class: `verdict${problemClass}`, dataset: { outcome: verdict.outcome || "" } },
      h("strong", { text: "check-deploy: " }),
      h("span", { text: verdict.outcome ? VERDICT_TEXT[verdict.outcome] || verdict.outcome : "not checked" }),
      h("span", { class: "hint", text: ` — ${verdict.detail}` })));
  }

  function renderUncertain() {
    if (!data.uncertain.length) { replace(uncertainBox); return; }
    replace(uncertainBox, data.uncertain.map((step) => h("div", { class: "banner blocked" },
      h("p", {}, "Blocked on step ", h("code", { text: step.step_id }), " (", h("span", { text: step.name }), "): ",
        "it is unsafe to repeat and started without a recorded outcome. Check its effect, then resolve it."),
      h("div", { class: "banner-actions" },
        mayOperate ? h("button", { type: "button", class: "primary", text: "Resolve on its node",
                      onclick: () => { select(null, `id:${step.step_id}`); panel.scrollIntoView({ block: "nearest" }); } })
          : null,
        commandLine(step.command)))));
  }

  function renderSummary() {
    const run = data.run;
    const rows = [
      ["Workflow", h("span", { class: "workflow", text: run.name })],
      ["Queue", h("span", {}, h("code", { text: run.queue }),
        h("span", { class: "hint", text: ` priority ${run.priority}${run.concurrency_key ? `, key ${run.concurrency_key}` : ""}` }))],
      ["Created", h("span", {}, timeCell(run.created_at), " ", h("span", { class: "hint", text: when(run.created_at) }))],
      ["First claimed", run.first_claimed_at ? timeCell(run.first_claimed_at) : "—"],
      ["Claimed", run.claimed_at ? timeCell(run.claimed_at) : "—"],
      ["Finished", run.completed_at ? timeCell(run.completed_at) : "—"],
      // Execution time, from the first claim to the end; the queue apart.
      ["Took", run.duration !== null ? seconds(run.duration) : "—"],
      ["Queued", run.queued !== null ? h("span", {}, seconds(run.queued),
        h("span", { class: "hint", text: " before its first claim" })) : "—"],
      ["Runner", runnerCell()],
    ];
    if (run.not_before) rows.splice(1, 0, ["Not before", h("span", {}, timeCell(run.not_before), " ", h("span", { class: "hint", text: when(run.not_before) }))]);
    // A wait without a timeout has no time to show: what ends it, as `show` says.
    else if (run.waiting) rows.splice(1, 0, ["Waits", h("span", { class: "waits", text: `${run.waiting.replace(/^waiting /, "")}, with no timeout` })]);
    if (run.attempts !== null && run.attempts !== undefined) rows.push(["Claims", String(run.attempts)]);
    if (run.idempotency_key) rows.push(["Idempotency key", h("code", { text: run.idempotency_key })]);
    if (run.deadline) rows.push(["Deadline", h("span", {}, timeCell(run.deadline), " ", h("span", { class: "hint", text: when(run.deadline) }))]);
    if (run.parent_id) rows.push(["Parent", h("a", { class: "mono parent-link", href: runHref(run.parent_id), text: run.parent_id })]);
    rows.push(["Version", run.app_version ? h("code", { text: run.app_version }) : "—"]);
    if (run.forked_from) {
      const copied = run.copied_steps;
      rows.push(["Forked from", h("span", {}, h("a", { class: "mono", href: runHref(run.forked_from), text: run.forked_from }),
        h("span", { class: "hint", text: ` ${copied} step${copied === 1 ? "" : "s"} copied from it (marked copied)` }))]);
    }
    // A run that continued as new, and the one it continued: its chain both ways.
    if (run.continued_from) rows.push(["Continued from", h("a", { class: "mono continued-from", href: runHref(run.continued_from), text: run.continued_from })]);
    if (run.continued_as) rows.push(["Continued as", h("a", { class: "mono continued-as", href: runHref(run.continued_as), text: run.continued_as })]);
    if (run.forks && run.forks.length) {
      rows.push(["Forks", h("ul", { class: "forks" }, run.forks.map((fork) => h("li", { dataset: { fork: fork.id } },
        h("a", { class: "mono fork", href: runHref(fork.id), text: fork.id }), " ", statusBadge(fork.status))))]);
    }
    replace(summary, rows.map(([term, value]) => [h("dt", { text: term }), h("dd", {}, value)]));
  }

  function runnerCell() {
    const runner = data.runner;
    if (!runner) return "—";
    const parts = [h("a", { href: href("/runners"), text: runner.name })];
    if (runner.kind) parts.push(h("span", { class: "hint", text: ` ${runner.kind}${runner.expired ? ", lease expired" : ""}` }));
    else parts.push(h("span", { class: "hint", text: " (not a live runner)" }));
    const child = runner.child;
    if (child) {
      parts.push(h("span", { class: "hint", text:
        ` · child ${child.slot} pid ${child.pid}${child.step_id ? ` in step ${child.step_id} (${child.step_name}) for ${seconds(child.step_seconds)}` : ""}` }));
    }
    return parts;
  }

  function renderPanel() {
    const node = selected ? findNode(data.graph, selected) : null;
    if (!node) {
      panelShown = null;
      replace(panel, h("p", { class: "hint", text: "Select a step to see its arguments, result, error and timings." }));
      return;
    }
    const signature = `${selected}|${node.state}|${node.record ? node.record.completed_at : ""}|${data.run.status}`;
    if (signature === panelShown) return; // keep a form being filled in
    panelShown = signature;
    const record = node.record;
    const parts = [
      h("h3", {}, h("span", { class: "node-label", text: node.label }), " ", h("code", { text: node.id || "?" })),
      h("p", {}, h("span", { class: `badge state-${node.state}`, text: node.state }),
        node.unsafe ? h("span", { class: "tag", text: "unsafe to repeat" }) : null,
        node.exactly_once ? h("span", { class: "tag", title: "transactional: its database writes commit with its record", text: "exactly once" }) : null,
        record && record.effect_uncertain ? h("span", { class: "tag uncertain", text: "effect uncertain" }) : null),
      h("p", { class: "mono small", text: node.function }),
    ];
    if (node.state === "diverged") {
      parts.push(h("p", { class: "problem", text: `Recorded as ${node.function}, but the code now calls ${node.expected} here: replaying this run raises WorkflowCodeError.` }));
    }
    if (!record) {
      parts.push(h("p", { class: "hint", text: node.state === "pending"
        ? (node.id ? `Not reached yet: it will be step ${node.id}.` : "Not reached yet; its step id depends on the path the run takes.")
        : "Not reached by this run." }));
    } else {
      parts.push(h("dl", { class: "summary small" },
        h("dt", { text: "Started" }), h("dd", { text: when(record.started_at) }),
        h("dt", { text: "Finished" }), h("dd", { text: record.completed_at ? when(record.completed_at) : "—" }),
        h("dt", { text: node.kind === "wait" ? "Waited" : "Took" }),
        h("dd", { text: record.duration !== null ? seconds(record.duration) : "—" }),
        record.attempt > 1 ? [h("dt", { text: "Attempt" }), h("dd", { text: String(record.attempt) })] : null,
        record.wake_at ? [h("dt", { text: record.status === "retrying" ? "Next attempt" : "Wakes" }),
                          h("dd", {}, timeCell(record.wake_at), " ", h("span", { class: "hint", text: when(record.wake_at) }))]
          : null));
      parts.push(jsonBlock("Arguments", record.args, "small"));
      if (record.kwargs && Object.keys(record.kwargs).length) parts.push(jsonBlock("Keyword arguments", record.kwargs, "small"));
      if (record.status === "done") parts.push(jsonBlock("Result", record.result, "small"));
      if (record.error) parts.push(errorBlock(record.error));
      if (record.attempts && record.attempts.length) parts.push(attemptsBlock(record.attempts));
      if (mayOperate && record.status === "started" && data.run.status === "blocked") {
        parts.push(resolveForm(data.run.id, { step_id: node.id, name: node.function }, () => { panelShown = null; }));
      }
    }
    replace(panel, parts);
  }

  function renderDetails() {
    const run = data.run;
    replace(details,
      jsonBlock("Arguments", run.args, "args"),
      run.status === "completed" ? jsonBlock("Result", run.result, "result") : null,
      errorBlock(run.error, run.status === "stopped" ? "Stopped" : run.status === "blocked" ? "Blocked" : "Error"));
  }

  // Children (each linking to its page, with its status), the events the
  // run published and the messages sent to it.
  function renderFamily() {
    // Each cell carries its column's name: a phone shows the rows as cards, headers hidden.
    const table = (cls, headers, rows) => {
      for (const row of rows) [...row.cells].forEach((cell, index) => { cell.dataset.label = headers[index]; });
      return h("div", { class: "table-scroll" }, h("table", { class: cls },
        h("thead", {}, h("tr", {}, headers.map((text) => h("th", { text })))), h("tbody", {}, rows)));
    };
    const parts = [];
    if (data.children.length) {
      parts.push(h("section", { class: "data children" }, h("h3", { text: "Child runs" }),
        table("children", ["Run", "Status", "Workflow"], data.children.map((child) => h("tr", { dataset: { child: child.id } },
          h("td", { class: "run-id" }, h("a", { class: "mono", href: runHref(child.id), title: child.id, text: child.id })),
          h("td", {}, statusBadge(child.status)), h("td", { class: "workflow", text: child.name }))))));
    }
    if (data.events.length) {
      parts.push(h("section", { class: "data events" }, h("h3", { text: "Events" }),
        table("events", ["Key", "Value", "Set"], data.events.map((event) => h("tr", { dataset: { event: event.key } },
          h("td", {}, h("code", { text: event.key })), h("td", { class: "mono small", text: pretty(event.value) }),
          h("td", { text: when(event.updated_at) }))))));
    }
    if (data.messages.length) {
      parts.push(h("section", { class: "data messages" }, h("h3", { text: "Messages" }),
        table("messages", ["Id", "Topic", "Payload", "Sent", "Consumed by step"], data.messages.map((message) =>
          h("tr", { dataset: { message: String(message.id) } },
            h("td", { text: String(message.id) }), h("td", {}, h("code", { text: message.topic })),
            h("td", { class: "mono small", text: pretty(message.payload) }), h("td", { text: when(message.created_at) }),
            h("td", { text: message.consumed_step || "pending" }))))));
    }
    replace(family, parts);
  }

  // The send form, for a run that still receives messages (kept while typed in).
  function renderSend() {
    if (!mayOperate || !data.send) { replace(sendBox); return; }
    if (sendBox.firstChild) return;
    const topic = h("input", { name: "topic", placeholder: "topic", required: true });
    const payload = h("textarea", { name: "payload", rows: 2, placeholder: "JSON payload, e.g. true" });
    const key = h("input", { name: "key", placeholder: "idempotency key (optional)" });
    const form = h("form", { class: "send-form", onsubmit: async (event) => {
      event.preventDefault();
      const answer = await runAction(data.run.id, { name: "send" },
        { topic: topic.value, payload: payload.value || "null", key: key.value || null });
      if (answer) { payload.value = ""; key.value = ""; }
    } }, h("h3", { text: "Send a message" }), topic, payload, key,
      h("button", { type: "submit", class: "primary", text: "Send" }));
    replace(sendBox, form);
  }

  async function loadMore(after) {
    try {
      const page = await get(`/api/runs/${encodeURIComponent(runId)}/steps`, { after, limit: STEPS_PAGE });
      more = more.concat(page.steps);
      moreNext = page.next;
      renderSteps();
    } catch (err) {
      problem.hidden = false;
      problem.textContent = err.message;
    }
  }

  function renderSteps() {
    const head = h("thead", {}, h("tr", {}, ["Step", "Function", "Status", "Attempt", "Started", "Took", "Outcome"].map((text) => h("th", { text }))));
    // The first page comes with every update; the pages fetched since stay.
    const first = new Set(data.steps.map((step) => step.step_id));
    const listed = data.steps.concat(more.filter((step) => !first.has(step.step_id)));
    const next = more.length ? moreNext : data.steps_next;
    const rows = listed.map((step) => {
      const took = step.completed_at && step.started_at ? (Date.parse(step.completed_at) - Date.parse(step.started_at)) / 1000 : null;
      const outcome = step.error ? `${step.error.type}: ${step.error.message}` : step.status === "done" ? pretty(step.result) : "";
      return h("tr", { dataset: { step: step.step_id } },
        h("td", { class: "step-id" }, h("button", { type: "button", class: "linkish mono", text: step.step_id,
                                  onclick: () => select(null, `id:${step.step_id}`) })),
        h("td", { class: "function mono small", text: step.name }),
        h("td", { class: "status" }, h("span", { class: `badge state-${step.status}`, text: step.status }),
          step.effect_uncertain ? h("span", { class: "tag uncertain", text: "effect uncertain" }) : null,
          step.copied ? h("span", { class: "tag copied", title: "copied from the run this one was forked from", text: "copied" }) : null),
        h("td", { class: "attempt", dataset: { attempt: String(step.attempt || 1) }, text: String(step.attempt || 1) }),
        h("td", { class: "started", text: when(step.started_at) }),
        h("td", { class: "took", text: took !== null ? seconds(took) : "" }),
        h("td", { class: `outcome ${step.error ? "error-cell" : "args-cell"}` }, h("span", { text: outcome.length > 200 ? `${outcome.slice(0, 199)}…` : outcome })));
    });
    replace(steps, head, h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7, class: "empty", text: "No step recorded yet." }))));
    const count = (n) => Number(n).toLocaleString("en");
    replace(stepsFoot, listed.length < data.steps_total
      ? h("p", { class: "steps-count hint", text: `the first ${count(listed.length)} of ${count(data.steps_total)} recorded steps` })
      : null,
    next ? h("button", { type: "button", class: "more-steps", text: `Show ${STEPS_PAGE} more`, onclick: () => loadMore(next) }) : null);
  }

  function render(next) {
    if (!next) return;
    data = next;
    problem.hidden = true;
    document.title = `Run ${data.run.id.slice(0, 8)} ${data.run.status} · everystep`;
    renderHead();
    renderVerdict();
    renderUncertain();
    renderSummary();
    replace(graphBox, renderGraph(data.graph, { selected, onSelect: select }));
    renderPanel();
    renderDetails();
    streamLogs.update(data.streams);
    renderFamily();
    renderSend();
    renderSteps();
  }

  live.start();
  return live;
}

export { runHref, nodeKey };
