// Runners: every supervisor and worker in the runner table, and for a
// supervisor each child with its run, workflow, step and time in step (as
// the supervisor published them with its heartbeat). Kill and scale go to
// the supervisor through the database, whichever host it runs on.

import { supervisorCommand } from "./actions.js";
import { Live, mayOperate, runHref } from "./api.js";
import { h, replace, roughly, seconds, shortId, timeCell } from "./dom.js";

function bytes(value) {
  if (value === null || value === undefined) return "";
  const mb = value / (1024 * 1024);
  return mb >= 1024 ? `${(mb / 1024).toFixed(1)} GiB` : `${mb.toFixed(0)} MiB`;
}

export function runnersPage(main) {
  const list = h("div", { class: "runners" });
  const problem = h("p", { class: "problem", role: "alert", hidden: true });
  replace(main, h("div", { class: "page-head" }, h("h1", { text: "Runners" }),
    h("p", { class: "hint", text: "Live supervisors and workers, from their heartbeats. A supervisor publishes its children every few seconds." })),
  problem, list);

  // Ages keep counting between updates.
  let received = Date.now();
  setInterval(() => {
    const elapsed = (Date.now() - received) / 1000;
    for (const el of list.querySelectorAll("[data-age]")) {
      if (el.dataset.age === "") continue;
      const value = Number(el.dataset.age) + elapsed;
      el.textContent = el.dataset.rough ? roughly(value) : seconds(value);
    }
  }, 1000);

  function age(value, format = seconds) {
    return h("span", { dataset: { age: value === null || value === undefined ? "" : String(value),
                                  rough: format === roughly ? "yes" : "" },
                       text: value === null || value === undefined ? "" : format(value) });
  }

  function heartbeatAge(runner) {
    return runner.heartbeat_at ? Math.max((Date.now() - Date.parse(runner.heartbeat_at)) / 1000, 0) : null;
  }

  // The page is re-rendered on every update (ages move every tick), so the
  // scale forms outlive renders: a number being typed is neither reset to
  // the published count nor loses focus until it is submitted.
  const scaleForms = new Map();

  function scaleForm(runner) {
    let entry = scaleForms.get(runner.name);
    if (!entry) {
      const input = h("input", { type: "number", min: 0, max: 256, "aria-label": `children of ${runner.name}`,
                                 class: "procs" });
      const form = h("form", { class: "scale" }, h("label", {}, "children ", input),
        h("button", { type: "submit", text: "Scale" }));
      const state = { form, input, edited: false };
      input.addEventListener("input", () => { state.edited = true; });
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        const procs = Number(input.value);
        state.edited = false;
        await supervisorCommand(runner.name, "scale", { procs });
      });
      entry = state;
      scaleForms.set(runner.name, entry);
    }
    if (!entry.edited && document.activeElement !== entry.input) {
      entry.input.value = runner.detail ? runner.detail.procs : "";
    }
    return entry.form;
  }

  function children(runner) {
    const detail = runner.detail;
    if (!detail) {
      return h("p", { class: "hint", text: runner.kind === "supervisor"
        ? "No children published yet." : "Threaded worker: runs on its threads, no children to show." });
    }
    const head = h("thead", {}, h("tr", {}, ["Child", "PID", "State", "Run", "Workflow", "Step", "In step", "USS", "RSS", "CPU", ""]
      .map((text) => h("th", { text }))));
    const rows = detail.children.map((child) => h("tr", { dataset: { slot: child.slot, run: child.run_id || "" } },
      h("td", { text: child.slot }),
      h("td", { class: "mono", text: child.pid }),
      h("td", {}, h("span", { class: `badge child-${child.state}`, text: child.state })),
      h("td", {}, child.run_id ? h("a", { href: runHref(child.run_id), class: "mono", title: child.run_id, text: shortId(child.run_id) }) : ""),
      h("td", { class: "workflow", text: child.workflow || "" }),
      h("td", {}, child.step_id ? [h("code", { text: child.step_id }), " ", h("span", { text: child.step_name || "" })] : ""),
      h("td", {}, child.step_seconds !== null && child.step_seconds !== undefined ? age(child.step_seconds) : ""),
      h("td", { text: child.uss === null || child.uss === undefined ? "" : bytes(child.uss),
                title: "what the child owns (unique set size): freed when it exits" }),
      h("td", { text: bytes(child.rss), title: "resident pages, the app's shared ones included" }),
      h("td", { text: child.cpu_percent === null || child.cpu_percent === undefined ? "" : `${child.cpu_percent.toFixed(0)} %` }),
      h("td", {}, mayOperate && child.run_id ? h("button", {
        type: "button", class: "danger small", text: "Kill", title: "kill this child; its step is recorded as StepKilled",
        onclick: async () => {
          if (!window.confirm(`Kill child ${child.slot} (pid ${child.pid}) running ${child.run_id}? Its step is recorded as failed (StepKilled).`)) return;
          await supervisorCommand(runner.name, "kill", { run: child.run_id, requeue: false });
        },
      }) : "")));
    return h("div", { class: "table-scroll" }, h("table", { class: "children" }, head,
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 11, class: "empty", text: "no children" })))));
  }

  function render(data) {
    problem.hidden = true;
    received = Date.now();
    if (!data.runners.length) {
      replace(list, h("p", { class: "empty", text: "No runner is registered: start everystep-supervisor or everystep worker." }));
      return;
    }
    for (const name of scaleForms.keys()) {
      if (!data.runners.some((runner) => runner.name === name)) scaleForms.delete(name);
    }
    const focused = list.contains(document.activeElement) ? document.activeElement : null;
    replace(list, data.runners.map((runner) => {
      const detail = runner.detail;
      return h("section", { class: `runner${runner.expired ? " expired" : ""}`, dataset: { runner: runner.name } },
        h("div", { class: "runner-head" },
          h("h2", { text: runner.name }),
          h("span", { class: "tag", text: runner.kind }),
          runner.expired ? h("span", { class: "badge status-failed", text: "lease expired" }) : h("span", { class: "badge status-completed", text: "alive" }),
          detail && detail.draining ? h("span", { class: "badge status-stopped", text: "draining" }) : null,
          mayOperate && runner.kind === "supervisor" && !runner.expired ? scaleForm(runner) : null),
        h("dl", { class: "summary inline" },
          h("dt", { text: "Host" }), h("dd", { text: runner.host }),
          h("dt", { text: "PID" }), h("dd", { class: "mono", text: runner.pid }),
          h("dt", { text: "Heartbeat" }), h("dd", {}, age(heartbeatAge(runner), roughly), " ago"),
          h("dt", { text: "Lease" }), h("dd", { text: seconds(runner.lease) }),
          h("dt", { text: "Running" }), h("dd", { text: runner.running }),
          h("dt", { text: "Started" }), h("dd", {}, timeCell(runner.started_at)),
          detail ? [h("dt", { text: "Children" }), h("dd", { text: detail.procs })] : null),
        children(runner));
    }));
    if (focused && focused.isConnected) focused.focus();
  }

  new Live("runners", {}, render, (message) => { problem.hidden = false; problem.textContent = message; }).start();
}
