// Talking to the console's server: JSON reads, CSRF-protected actions, and
// live views over server-sent events with a polling fallback.

const body = document.body.dataset;
export const root = body.root || "";
const csrf = body.csrf || "";
// The header the server reads the token from (a Django project names its own).
const csrfHeader = body.csrfHeader || "x-csrf-token";
// Whether this user may act (otherwise the page offers no action).
export const mayOperate = body.operate !== "no";
// Whether the server streams updates (otherwise pages poll).
const streaming = body.stream !== "off";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function query(params) {
  const clean = {};
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") clean[key] = value;
  }
  const text = new URLSearchParams(clean).toString();
  return text ? `?${text}` : "";
}

async function answer(response) {
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = null;
  }
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.error) || `${response.status} ${response.statusText}`);
  }
  return data;
}

export async function get(path, params) {
  const response = await fetch(`${root}${path}${query(params)}`, {
    headers: { accept: "application/json" }, credentials: "same-origin", cache: "no-store",
  });
  return answer(response);
}

export async function post(path, data) {
  const response = await fetch(`${root}${path}`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json", accept: "application/json", [csrfHeader]: csrf },
    body: JSON.stringify(data || {}),
  });
  return answer(response);
}

export function href(path) {
  return `${root}${path}`;
}

export function runHref(id) {
  return href(`/runs/${encodeURIComponent(id)}`);
}

// -- live views ----------------------------------------------------------------------------

const POLL_MS = 2000;
const REOPEN_MS = 5000;

function showState(state, detail) {
  const el = document.getElementById("live");
  if (!el) return;
  el.dataset.state = state;
  el.textContent = { live: "live", polling: "polling", offline: "offline", connecting: "connecting…" }[state] || state;
  el.title = detail || {
    live: "updates stream from the server as they happen",
    polling: streaming ? "the live stream is down: refreshing every 2 s until it is back"
      : "live updates are off on this server: refreshing every 2 s",
    offline: "the server cannot be reached",
  }[state] || "";
}

// A view kept current: the stream's `update` events while it is open, a GET
// of the same data every two seconds while it is not (or always, where the
// server does not stream).
export class Live {
  constructor(view, params, onData, onProblem) {
    this.view = view;
    this.params = params || {};
    this.onData = onData;
    this.onProblem = onProblem || (() => {});
    this.timer = null;
    this.source = null;
    this.closed = false;
  }

  start() {
    showState("connecting");
    if (!streaming) {
      this.startPolling();
      return this;
    }
    this.open();
    return this;
  }

  path() {
    if (this.view === "run") return `/api/runs/${encodeURIComponent(this.params.id)}`;
    return `/api/${this.view}`;
  }

  pollParams() {
    const params = { ...this.params };
    if (this.view === "run") delete params.id;
    return params;
  }

  open() {
    if (this.closed) return;
    const source = new EventSource(`${root}/api/stream${query({ view: this.view, ...this.params })}`);
    this.source = source;
    source.addEventListener("open", () => {
      if (source !== this.source) return;
      showState("live");
      this.stopPolling();
    });
    source.addEventListener("update", (event) => {
      if (source !== this.source) return;
      this.onData(JSON.parse(event.data));
    });
    source.addEventListener("problem", (event) => {
      if (source !== this.source) return;
      this.onProblem(JSON.parse(event.data).error);
    });
    source.addEventListener("error", () => {
      if (source !== this.source || this.closed) return;
      showState("polling");
      this.startPolling();
      if (source.readyState === EventSource.CLOSED) {
        // The browser gave up (the server refused the stream): try again later.
        setTimeout(() => { if (source === this.source) this.open(); }, REOPEN_MS);
      }
    });
  }

  startPolling() {
    if (this.timer !== null) return;
    const tick = async () => {
      try {
        this.onData(await get(this.path(), this.pollParams()));
        if (!this.source || this.source.readyState !== EventSource.OPEN) showState("polling");
      } catch (err) {
        showState("offline", err.message);
        this.onProblem(err.message);
      }
    };
    tick();
    this.timer = setInterval(tick, POLL_MS);
  }

  stopPolling() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  // New parameters (filters, page): reconnect the stream for them.
  update(params) {
    this.params = params || {};
    if (this.source) this.source.close();
    this.stopPolling();
    if (streaming) this.open();
    else this.startPolling();
  }

  close() {
    this.closed = true;
    if (this.source) this.source.close();
    this.stopPolling();
  }
}
