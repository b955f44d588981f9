// Nodes page: one card per node (site inventory + summary + every node's /state). The inventory carries
// each node's telemetry (host, GPUs, runtimes, "needs attention"), read at the master's health poll.

import { get, post, query } from "./api.js";
import { badge, clock, duration, errorBox, h, replace, table } from "./dom.js";
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

function gib(bytes) {
  return bytes === null || bytes === undefined ? "–" : `${(bytes / 1024 ** 3).toFixed(1)} GiB`;
}

function num(value, digits, unit) {
  return value === null || value === undefined ? "–" : `${Number(value).toFixed(digits)}${unit}`;
}

function gauge(used, total) {
  const share = total ? Math.min(100, Math.max(0, (100 * used) / total)) : 0;
  return h("span", { className: "gauge" }, h("span", { style: `width: ${share.toFixed(1)}%` }));
}

// The host and its GPUs: CPU, RAM, then one row per NVIDIA GPU, or "no GPU" where NVML finds none.
function host(telemetry) {
  const hw = telemetry.host;
  const cpu = hw ? h("span", { className: "cpu" }, gauge(hw.cpu_percent, 100),
    `CPU ${num(hw.cpu_percent, 0, " %")} of ${hw.cpu_count} cores`) : null;
  const ram = hw ? h("span", { className: "ram" }, gauge(hw.memory_used_bytes, hw.memory_total_bytes),
    `RAM ${gib(hw.memory_used_bytes)} / ${gib(hw.memory_total_bytes)}`) : null;
  const gpu = telemetry.gpu || { state: "none", gpus: [] };
  let gpus;
  if (gpu.state === "ok") {
    gpus = table(["GPU", "utilisation", "VRAM", "temperature", "power"], gpu.gpus.map((g) =>
      h("tr", { dataset: { gpu: String(g.index) } },
        h("td", {}, `${g.index}: ${g.name}`),
        h("td", {}, gauge(g.utilization_percent || 0, 100), num(g.utilization_percent, 0, " %")),
        h("td", {}, gauge(g.memory_used_bytes || 0, g.memory_total_bytes),
          `${gib(g.memory_used_bytes)} / ${gib(g.memory_total_bytes)}`),
        h("td", {}, num(g.temperature_c, 0, " °C")),
        h("td", {}, num(g.power_w, 0, " W") + (g.power_limit_w ? ` / ${num(g.power_limit_w, 0, " W")}` : "")))),
    { className: "gpus" });
  } else if (gpu.state === "error") {
    gpus = h("div", { className: "gpu-state error" }, "GPU reading failed: " + gpu.reason);
  } else {
    gpus = h("div", { className: "gpu-state none", title: gpu.reason || "" }, "no GPU");
  }
  return h("div", { className: "host" },
    h("div", { className: "host-line" }, cpu, ram,
      telemetry.host_error ? h("span", { className: "error" }, telemetry.host_error) : null,
      h("span", { className: "taken" }, "read " + clock(telemetry.taken_ms))),
    gpus);
}

function attention(telemetry) {
  const flags = telemetry ? telemetry.attention || [] : [];
  if (flags.length === 0) return null;
  return h("ul", { className: "attention" }, flags.map((f) =>
    h("li", { dataset: { code: f.code, runtime: f.runtime || "" } }, badge(f.code.replace("_", " "), "bad"),
      " " + f.message)));
}

function counters(t) {
  if (!t) return "";
  if (!t.counters) return t.counters_error ? h("span", { className: "muted", title: t.counters_error }, "–") : "";
  const c = t.counters;
  return h("span", { className: "counters", title: `prompt ${num(c.prompt_tokens_per_second, 0, " tok/s")}, `
    + `${c.prompt_tokens_total ?? "–"} prompt tokens (${c.prompt_tokens_cached_total ?? 0} cached), `
    + `${c.tokens_predicted_total ?? "–"} generated, longest sequence ${c.n_tokens_max ?? "–"}` },
  num(c.tokens_per_second, 1, ""));
}

function runtimes(nodeId, list, telemetry) {
  const byKind = new Map(((telemetry && telemetry.runtimes) || []).map((t) => [t.kind, t]));
  const rows = (list || []).map((rt) => {
    const loaded = rt.model_id && !["empty", "closed"].includes(rt.state);
    const t = byKind.get(rt.kind);
    const since = t && t.loaded_since_ms ? clock(t.loaded_since_ms).slice(0, 8) : "";
    return h("tr", { dataset: { kind: rt.kind } },
      h("td", {}, rt.kind),
      h("td", {}, badge(rt.state, "rt-" + rt.state),
        rt.last_error ? h("div", { className: "last-error error" }, rt.last_error) : null),
      h("td", { className: "model" }, loaded ? rt.model_id : "–"),
      h("td", { className: "queue" }, t ? String(t.queue_depth) : String(rt.waiters ?? "–")),
      h("td", { className: "loaded", title: "loaded since, and how long its last load took" },
        since ? `${since} (${duration(rt.last_load_ms)})` : (rt.last_load_ms ? duration(rt.last_load_ms) : "–")),
      h("td", { className: "loads" }, t ? `${t.loads}${t.failed_loads ? ` +${t.failed_loads} failed` : ""}` : "–"),
      h("td", { className: "rate" }, counters(t)),
      h("td", {}, loaded
        ? h("button", { type: "button", className: "unload",
          onclick: (e) => unload(nodeId, rt, e.currentTarget) }, "Unload")
        : ""));
  });
  const span = telemetry ? `/${Math.round(telemetry.window_s / 60)} min` : "";
  return table(["runtime", "state", "loaded model", "queue", "loaded since (took)", "loads" + span,
    "tok/s", ""], rows, { className: "runtimes" });
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
  const telemetry = node.telemetry;
  const flagged = telemetry && (telemetry.attention || []).length > 0;
  return h("article", { className: "card node-card" + (flagged ? " needs-attention" : ""),
    dataset: { nodeId: node.node_id } },
    h("header", {},
      h("h2", {}, node.node_id),
      badge(node.role, "role"),
      badge(node.healthy ? "healthy" : "unhealthy", node.healthy ? "ok" : "bad"),
      flagged ? badge("needs attention", "bad") : null,
      h("span", { className: "build" }, "build " + (node.build_version || "?")),
      sync),
    h("div", { className: "url" }, node.node_url),
    error ? h("div", { className: "error" }, error) : null,
    attention(telemetry),
    telemetry ? host(telemetry)
      : h("p", { className: "empty telemetry-missing" }, node.telemetry_error
        ? "telemetry unreadable: " + node.telemetry_error : "no telemetry yet"),
    h("h3", {}, "Runtimes"),
    state ? runtimes(node.node_id, state.runtimes, telemetry) : h("p", { className: "empty" }, "no state"),
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
