// Building the page. Every piece of data goes into the DOM as a text node
// or an attribute value, never as HTML: nothing a run carries (arguments,
// results, error messages, step names) can become markup or script.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

export function pretty(value) {
  if (value === undefined) return "";
  try {
    return JSON.stringify(value, null, 2);
  } catch (err) {
    return String(value);
  }
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "";
}

export function seconds(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "";
  const s = Number(value);
  if (s < 0.001) return "<1 ms";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
}

// How far a time is from now, either way: "3 min ago", "in 59 min".
export function ago(iso) {
  if (!iso) return "";
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return String(iso);
  const past = (Date.now() - then) / 1000;
  return past >= 0 ? `${roughly(past)} ago` : `in ${roughly(-past)}`;
}

// Whole units, for ages ("12 s ago", "3 min ago") and times to come.
export function roughly(s) {
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

export function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function timeCell(iso) {
  return h("time", { datetime: iso || "", title: when(iso), text: ago(iso) });
}

export function statusBadge(status) {
  return h("span", { class: `badge status-${status}`, text: status });
}

export function count(n) {
  return Number(n).toLocaleString("en-US");
}

let toastSeq = 0;

export function toast(message, kind = "info", sticky = false) {
  const box = document.getElementById("toasts");
  const id = `toast-${++toastSeq}`;
  const el = h("div", { class: `toast toast-${kind}`, id, role: kind === "error" ? "alert" : "status" },
    h("span", { class: "toast-text", text: message }),
    h("button", { class: "toast-close", type: "button", title: "dismiss", onclick: () => el.remove(), text: "×" }));
  box.append(el);
  if (!sticky) setTimeout(() => el.remove(), kind === "error" ? 12000 : 6000);
  return el;
}

export function copyButton(text) {
  return h("button", {
    class: "copy", type: "button", title: "copy to the clipboard", text: "copy",
    onclick: async (event) => {
      try {
        await navigator.clipboard.writeText(text);
        event.target.textContent = "copied";
      } catch (err) {
        event.target.textContent = "select and copy";
      }
    },
  });
}
