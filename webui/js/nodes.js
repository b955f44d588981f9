// Nodes page: one card per node (site inventory + summary + every node's /state).

import { get, post, query } from "./api.js";
import { badge, duration, errorBox, h, replace, table } from "./dom.js";
import { act } from "./shell.js";

export function mount(container) {
  const body = h("div", { className: "cards" });
  replace(container, h("h1", {}, "Nodes"), h("div", { className: "errors-slot" }), body);
  return { container, body };
}

function unload(nodeId, runtime, button) {
  // "stopping" is the runtime's own state (the badge); the result stays in a notice
  return act({ label: `Unload ${runtime.kind} on ${nodeId}`, button,
    run: () => post("/router/v1/site/nodes/unload", { node_id: nodeId, target: runtime.kind }) });
}

function runtimes(nodeId, list) {
  const rows = (list || []).map((rt) => {
    const loaded = rt.model_id && !["empty", "closed"].includes(rt.state);
    return h("tr", { dataset: { kind: rt.kind } },
      h("td", {}, rt.kind),
      h("td", {}, badge(rt.state, "rt-" + rt.state)),
      h("td", { className: "model" }, loaded ? rt.model_id : "–"),
      h("td", {}, rt.last_error || ""),
      h("td", {}, loaded
        ? h("button", { type: "button", className: "unload",
          onclick: (e) => unload(nodeId, rt, e.currentTarget) }, "Unload")
        : ""));
  });
  return table(["runtime", "state", "loaded model", "last error", ""], rows, { className: "runtimes" });
}

function active(nodeId, list) {
  if (!list || list.length === 0) return h("p", { className: "empty" }, "none");
  return table(["request", "model", "route", "state", "running for"],
    list.map((a) => h("tr", { dataset: { key: `active/${nodeId}/${a.request_id}` } },
      h("td", { className: "rid" }, a.request_id),
      h("td", {}, a.model_id + (a.borrowed ? " (borrowed)" : "")),
      h("td", {}, a.route || ""),
      h("td", {}, a.state || ""),
      h("td", {}, duration(a.elapsed_ms)))), { className: "active" });
}

// Priority classes, highest first (issue 23): waiting requests are listed in that order.
const CLASS_ORDER = { interactive: 0, standard: 1, batch: 2 };

function byClass(list) {
  return list.map((r, i) => [r, i]).sort(([a, i], [b, j]) =>
    ((CLASS_ORDER[a.priority] ?? 1) - (CLASS_ORDER[b.priority] ?? 1)) || i - j).map(([r]) => r);
}

function held(nodeId, list) {
  if (!list || list.length === 0) return h("p", { className: "empty" }, "none");
  return table(["request", "lane", "model", "class", "key", "state", "helper", "waiting"],
    byClass(list).map((r) => h("tr", { className: "held-row " + r.state,
      dataset: { priority: r.priority || "", key: `held/${nodeId}/${r.request_id}` } },
      h("td", { className: "rid" }, r.request_id),
      h("td", {}, r.lane),
      h("td", {}, r.model_id),
      h("td", { className: "priority" }, r.priority ? badge(r.priority, "class-" + r.priority) : ""),
      h("td", { className: "key" }, r.key_name || ""),
      h("td", {}, badge(r.state)),
      h("td", {}, r.helper_node_id ? `${r.helper_node_id}/${r.helper_model_id}` : ""),
      h("td", {}, duration(r.waiting_ms)))), { className: "held" });
}

function card(node, summary, state, error) {
  const sync = summary ? (summary.in_sync ? badge("settings in sync", "ok") : badge("settings differ", "warn"))
    : badge("settings unknown", "warn");
  return h("article", { className: "card node-card", dataset: { nodeId: node.node_id } },
    h("header", {},
      h("h2", {}, node.node_id),
      badge(node.role, "role"),
      badge(node.healthy ? "healthy" : "unhealthy", node.healthy ? "ok" : "bad"),
      h("span", { className: "build" }, "build " + (node.build_version || "?")),
      sync),
    h("div", { className: "url" }, node.node_url),
    error ? h("div", { className: "error" }, error) : null,
    h("h3", {}, "Runtimes"),
    state ? runtimes(node.node_id, state.runtimes) : h("p", { className: "empty" }, "no state"),
    h("h3", {}, `Active requests (${state ? state.active_requests.length : 0})`),
    state ? active(node.node_id, state.active_requests) : null,
    h("h3", {}, `Held requests (${state ? state.held_requests.length : 0})`),
    state ? held(node.node_id, state.held_requests) : null);
}

export async function refresh(ctx) {
  const [inventory, summary, states] = await Promise.all([
    get("/router/v1/site/inventory"),
    get("/router/v1/site/offload/summary"),
    get("/router/v1/site/nodes/states" + query({})),
  ]);
  const summaries = new Map(summary.nodes.map((n) => [n.node_id, n]));
  const byNode = new Map(states.states.map((s) => [s.node_id, s]));
  const errors = new Map([...(states.node_errors || []), ...(summary.node_errors || [])]
    .map((e) => [e.node_id, e.error]));
  replace(ctx.body, inventory.nodes.map((node) =>
    card(node, summaries.get(node.node_id), byNode.get(node.node_id), errors.get(node.node_id))));
  replace(ctx.container.querySelector(".errors-slot"),
    errorBox([...(states.node_errors || [])]));
}
