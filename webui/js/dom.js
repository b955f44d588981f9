// Small DOM helpers: h() builds an element tree; nothing else touches innerHTML, so every value
// that came from the API is inserted as text.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "className") {
      el.className = value;
    } else if (name in el && typeof value !== "string") {
      el[name] = value;
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function table(head, rows, props) {
  return h("table", props || {},
    h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows));
}

export function badge(text, kind) {
  return h("span", { className: "badge " + (kind || text) }, text);
}

export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  const value = Number(ms);
  if (Math.abs(value) < 1000) return `${Math.round(value)} ms`;
  if (Math.abs(value) < 60000) return `${(value / 1000).toFixed(1)} s`;
  const minutes = Math.floor(value / 60000);
  const seconds = Math.round((value % 60000) / 1000);
  if (minutes < 60) return `${minutes} min ${seconds} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

export function clock(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function errorBox(errors) {
  if (!errors || errors.length === 0) return null;
  return h("div", { className: "node-errors" },
    errors.map((e) => h("div", { className: "error" }, `${e.node_id}: ${e.error}`)));
}
