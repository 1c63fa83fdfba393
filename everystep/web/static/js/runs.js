// The runs list: counts per status, filters (built from /api/meta; the
// status filter has "waiting" too: scheduled runs not due yet), id prefix
// search, keyset pages, live rows (a waiting run says what it waits for).

import { Live, get, href, runHref } from "./api.js";
import { count, h, replace, seconds, statusBadge, timeCell, toast } from "./dom.js";

const FILTER_KEYS = ["status", "workflow", "queue", "q"];

function readState() {
  const params = new URLSearchParams(window.location.search);
  const state = {};
  for (const key of [...FILTER_KEYS, "before", "after"]) {
    if (params.get(key)) state[key] = params.get(key);
  }
  return state;
}

export async function runsPage(main, options = {}) {
  const view = options.view || "runs";
  let state = readState();
  if (view === "blocked") delete state.status;
  let meta = { filters: [], statuses: [], workflows: [] };
  try {
    meta = await get("/api/meta");
  } catch (err) {
    toast(err.message, "error");
  }

  const countsBar = h("div", { class: "counts", role: "group", "aria-label": "runs per status" });
  const form = h("form", { class: "filters", role: "search" });
  const table = h("table", { class: "runs" });
  const pager = h("div", { class: "pager" });
  const problem = h("p", { class: "problem", role: "alert", hidden: true });
  replace(main,
    h("div", { class: "page-head" }, h("h1", { text: options.title || "Runs" }),
      options.blurb ? h("p", { class: "hint", text: options.blurb }) : null),
    view === "runs" ? countsBar : null, view === "runs" ? form : null, problem, table, pager);

  const live = new Live(view, streamParams(), render, (message) => {
    problem.hidden = false;
    problem.textContent = message;
  });

  function streamParams() {
    const params = { ...state };
    return params;
  }

  function navigate(next, push = true) {
    state = next;
    const text = new URLSearchParams(state).toString();
    const url = `${window.location.pathname}${text ? `?${text}` : ""}`;
    if (push) window.history.pushState(null, "", url);
    live.update(streamParams());
  }

  window.addEventListener("popstate", () => {
    state = readState();
    buildForm();
    live.update(streamParams());
  });

  function buildForm() {
    if (view !== "runs") return;
    const fields = meta.filters.map((filter) => {
      let input;
      if (filter.kind === "select") {
        input = h("select", { name: filter.name, "aria-label": filter.label },
          h("option", { value: "", text: `any ${filter.label.toLowerCase()}` }),
          filter.options.map((option) => h("option", { value: option, text: option, selected: state[filter.name] === option })));
      } else {
        input = h("input", { name: filter.name, type: "search", placeholder: filter.placeholder || "",
                             value: state[filter.name] || "", "aria-label": filter.label,
                             list: filter.name === "workflow" ? "workflow-names" : null });
      }
      return h("label", { class: "field" }, h("span", { text: filter.label }), input);
    });
    replace(form, fields,
      h("datalist", { id: "workflow-names" }, meta.workflows.map((name) => h("option", { value: name }))),
      h("button", { type: "submit", class: "primary", text: "Apply" }),
      h("button", { type: "button", text: "Clear", onclick: () => { form.reset(); navigate({}); buildForm(); } }));
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const next = {};
    for (const key of FILTER_KEYS) {
      const value = (data.get(key) || "").toString().trim();
      if (value) next[key] = value;
    }
    navigate(next);
  });

  function renderCounts(counts) {
    replace(countsBar, counts.map((item) => {
      const active = state.status === item.status;
      const shown = `${item.exact ? "" : "≈"}${count(item.count)}`;
      return h("button", {
        type: "button", class: `count status-${item.status}${active ? " active" : ""}`,
        title: item.exact ? `exact${item.age ? `, ${seconds(item.age)} old` : ""}`
          : `estimated${item.age ? `, ${seconds(item.age)} old` : ""}`,
        dataset: { status: item.status },
        onclick: () => {
          const next = { ...state };
          delete next.before; delete next.after;
          if (active) delete next.status; else next.status = item.status;
          navigate(next);
          buildForm();
        },
      }, h("span", { class: "count-status", text: item.status }), h("span", { class: "count-value", text: shown }));
    }));
  }

  function renderRows(data) {
    const head = h("thead", {}, h("tr", {},
      ["Run", "Workflow", "Queue", "Status", "Created", "Took", "Runner", view === "blocked" ? "Uncertain step" : "Arguments / error"]
        .map((text) => h("th", { text }))));
    const rows = data.runs.map((run) => {
      const last = view === "blocked"
        ? h("td", { class: "last uncertain" }, (run.uncertain || []).map((step) => h("div", {},
          h("code", { text: step.step_id }), " ", h("span", { text: step.name }), " ",
          h("a", { href: `${runHref(run.id)}#step=${encodeURIComponent(step.step_id)}`, class: "resolve-link",
                   text: "resolve…" }))))
        : h("td", { class: `last ${run.error ? "error-cell" : "args-cell"}`, title: run.error || run.args_preview },
          run.waiting ? h("div", { class: "wait-note", text: run.waiting }) : null,
          h("span", { text: run.error || run.args_preview }));
      return h("tr", { dataset: { run: run.id, status: run.status } },
        h("td", { class: "run-id" }, h("a", { href: runHref(run.id), class: "mono", title: run.id, text: run.id })),
        h("td", { class: "workflow", text: run.name }),
        h("td", { class: "queue", text: run.queue }),
        h("td", { class: "status" }, statusBadge(run.status)),
        h("td", { class: "created" }, timeCell(run.created_at)),
        h("td", { class: "took", text: seconds(run.duration),
                  title: run.queued !== null && run.queued !== undefined ? `queued ${seconds(run.queued)} before its first claim` : null }),
        h("td", { class: "runner", text: run.claimed_by || "" }),
        last);
    });
    const empty = data.runs.length ? null : h("tr", {}, h("td", { colspan: 8, class: "empty",
      text: view === "blocked" ? "No blocked runs." : "No runs match." }));
    replace(table, head, h("tbody", {}, rows, empty));
  }

  function renderPager(data) {
    const go = (key, cursor) => {
      const next = { ...state };
      delete next.before; delete next.after;
      next[key] = cursor;
      navigate(next);
    };
    replace(pager,
      h("button", { type: "button", disabled: !data.newer && !state.before && !state.after, text: "« Newest",
                    onclick: () => { const next = { ...state }; delete next.before; delete next.after; navigate(next); } }),
      h("button", { type: "button", disabled: !data.newer, text: "‹ Newer", onclick: () => go("after", data.newer) }),
      h("button", { type: "button", disabled: !data.older, text: "Older ›", onclick: () => go("before", data.older) }),
      h("span", { class: "hint", text: `${data.runs.length} shown` }));
  }

  function render(data) {
    problem.hidden = true;
    if (view === "runs") renderCounts(data.counts);
    renderRows(data);
    renderPager(data);
    if (view === "runs" && state.q && data.runs.length === 1 && data.runs[0].id === state.q) {
      window.location.assign(runHref(data.runs[0].id));
    }
  }

  buildForm();
  live.start();
  return live;
}

export function blockedPage(main) {
  return runsPage(main, {
    view: "blocked",
    title: "Blocked runs",
    blurb: "Each waits on an unsafe-to-repeat step whose effect may or may not have happened. "
      + "Check the external system, then resolve the step on the run's page.",
  });
}

export { href };
