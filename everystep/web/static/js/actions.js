// Operator actions: run actions (the server applies the CLI's rules and
// explains refusals), requests to supervisors (wait for their reply), and
// the resolve form offered on an uncertain step.

import { ApiError, get, post, runHref } from "./api.js";
import { copyButton, h, toast } from "./dom.js";

const REPLY_TIMEOUT_MS = 15000;
const REPLY_POLL_MS = 300;

function refusal(err) {
  return err instanceof ApiError ? err.message : `request failed: ${err.message}`;
}

// A run action (requeue, rerun, kill…). Returns the server's answer, or null.
export async function runAction(runId, action, body = {}) {
  if (action.confirm && !window.confirm(action.confirm)) return null;
  try {
    const answer = await post(`/api/runs/${encodeURIComponent(runId)}/${action.name}`, body);
    if (answer.request) return await awaitReply(answer.request);
    toast(answer.message || "done", "ok");
    if (answer.new_run) {
      window.location.assign(runHref(answer.new_run));
    }
    return answer;
  } catch (err) {
    // A live runner holds it: the CLI's way out is --force, offered here
    // only after its refusal was read.
    if (action.name === "requeue" && !body.force && err instanceof ApiError && err.message.includes("--force")
        && window.confirm(`${err.message}\n\nForce the requeue? The execution in progress is fenced: `
                          + "its writes are refused and its supervisor kills it.")) {
      return runAction(runId, { ...action, confirm: null }, { ...body, force: true });
    }
    toast(refusal(err), "error");
    return null;
  }
}

// A command for a live supervisor (kill, scale), relayed through the database.
export async function supervisorCommand(runner, command, body) {
  try {
    const answer = await post(`/api/runners/${encodeURIComponent(runner)}/${command}`, body);
    return await awaitReply(answer.request);
  } catch (err) {
    toast(refusal(err), "error");
    return null;
  }
}

async function awaitReply(request) {
  const waiting = toast(`asked ${request.runner} to ${request.command}; waiting for its reply…`, "info", true);
  const deadline = Date.now() + REPLY_TIMEOUT_MS;
  let state = request;
  try {
    while (Date.now() < deadline) {
      state = await get(`/api/requests/${request.id}`);
      if (state.done) break;
      await new Promise((resolve) => setTimeout(resolve, REPLY_POLL_MS));
    }
    if (!state.done) state = await post(`/api/requests/${request.id}/expire`);
  } catch (err) {
    waiting.remove();
    toast(refusal(err), "error");
    return null;
  }
  waiting.remove();
  const ok = state.status === "answered" && state.reply && state.reply.ok;
  toast(`${request.runner}: ${state.outcome}`, ok ? "ok" : "error");
  return state;
}

// The three ways to resolve an uncertain step, with the CLI's words.
export function resolveForm(runId, step, onDone) {
  const choice = (value, label, hint) => h("label", { class: "choice" },
    h("input", { type: "radio", name: `how-${step.step_id}`, value, checked: value === "result" }),
    h("span", { class: "choice-label", text: label }), h("span", { class: "hint", text: hint }));
  const resultBox = h("textarea", { class: "resolve-result", rows: 3, spellcheck: "false", placeholder: '{"charged": 100}',
                                    "aria-label": "result as JSON" });
  const errorBox = h("input", { class: "resolve-error", type: "text", placeholder: "card declined", "aria-label": "error message" });
  const status = h("p", { class: "form-status", role: "status" });
  const form = h("form", { class: "resolve-form", "data-step": step.step_id },
    h("h4", { text: `Resolve step ${step.step_id}` }),
    h("p", { class: "hint", text: "Check the external system first: this step may or may not have had its effect." }),
    choice("result", "It happened", "record this JSON value as the step's result"),
    resultBox,
    choice("error", "It happened and failed", "replay raises StepFailure(message) at the call"),
    errorBox,
    choice("discard", "It did not happen", "run the step again"),
    h("div", { class: "form-actions" },
      h("button", { type: "submit", class: "primary", text: "Resolve" })),
    status,
    h("p", { class: "hint", text: "The same from a shell:" }),
    commandLine(`everystep resolve-step ${runId} ${step.step_id} --result JSON | --error MESSAGE | --discard`));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const how = form.querySelector(`input[name="how-${step.step_id}"]:checked`).value;
    const body = { step: step.step_id };
    if (how === "result") body.result = resultBox.value.trim() || "null";
    else if (how === "error") body.error = errorBox.value;
    else body.discard = true;
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    status.textContent = "resolving…";
    try {
      const answer = await post(`/api/runs/${encodeURIComponent(runId)}/resolve`, body);
      status.textContent = answer.message;
      toast(answer.message, "ok");
      if (onDone) onDone(answer);
    } catch (err) {
      status.textContent = refusal(err);
      status.classList.add("error");
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

export function commandLine(text) {
  return h("div", { class: "command" }, h("code", { text }), copyButton(text));
}
