// Overview (the first page): the period's KPIs from site analytics, "Requests by lane" over 1h / 24h /
// 7d / 30d (1h, until the operator picks one, while everything recorded is from the last hour: a first
// run), a note naming each node with analytics off and its /metrics counters meanwhile, what needs
// attention (unhealthy nodes, failed loads, nodes not running the master's settings, models with
// unresolved assets), a card per node, the newest finished requests of every node (site
// analytics/recent) and the requests in flight now.

import { badge, clock, duration, h, replace, table } from "./dom.js";
import { get, query, storedKey } from "./api.js";
import { chart } from "./charts.js";
import { count, millis, modelCell, optional, percent, PERIODS, periodPicker, rate } from "./figures.js";
import { refreshNow } from "./shell.js";

const ANALYTICS_EVERY_MS = 5000; // the rollups change by the minute: no need to ask every tick

export function mount(container) {
  // `auto`: the period follows the data (1h while it spans less than an hour) until a period is clicked.
  const ctx = { container, period: "1h", auto: true, analytics: null, fetchedAt: 0 };
  ctx.kpis = h("div", { className: "kpis", id: "kpis" });
  ctx.note = h("p", { className: "empty analytics-note" });
  ctx.off = h("div", { id: "analytics-off" });
  ctx.periods = periodPicker(PERIODS, ctx.period, (p) => {
    ctx.period = p;
    ctx.auto = false;
    ctx.fetchedAt = 0;
    refreshNow();
  });
  ctx.lanes = chart("lanes", "Requests by lane");
  ctx.attention = h("div", { id: "attention-list" });
  ctx.cards = h("div", { className: "cards node-summary" });
  ctx.recent = h("div", {});
  ctx.finished = h("div", { id: "recent-finished" });
  replace(container,
    h("h1", {}, "Overview"),
    h("section", { id: "overview-kpis" },
      ctx.periods, ctx.kpis, ctx.note, ctx.off),
    h("div", { className: "columns" },
      h("section", { id: "lanes-chart" }, ctx.lanes.el),
      h("section", { id: "attention" }, h("h2", {}, "Needs attention"), ctx.attention)),
    h("section", { id: "overview-nodes" }, h("h2", {}, "Nodes"), ctx.cards),
    h("section", { id: "recent" }, h("h2", {}, "Recent requests"), ctx.finished,
      h("h3", {}, "In flight now"), ctx.recent));
  return ctx;
}

function kpi(label, value, name) {
  return h("div", { className: "kpi", dataset: { kpi: name } }, h("div", { className: "kpi-value" }, value),
    h("div", { className: "kpi-label" }, label));
}

function renderKpis(ctx, doc) {
  if (!doc || doc.__error) {
    replace(ctx.kpis);
    ctx.note.textContent = "Analytics is not available here: " + (doc ? doc.__error : "no answer");
    return;
  }
  const t = doc.totals || {};
  const tokens = (t.prompt_tokens || 0) + (t.completion_tokens || 0);
  replace(ctx.kpis,
    kpi("requests", count(t.requests), "requests"),
    kpi("tokens", count(tokens), "tokens"),
    kpi("images", count(t.images), "images"),
    kpi("errors", count(t.errors), "errors"),
    kpi("served by lending", percent(t.lent || 0, t.requests || 0), "lending"),
    kpi("p95 latency", millis(t.p95_ms), "p95"),
    kpi("tokens/s", rate(t.tokens_per_s), "tokens_per_s"));
  ctx.note.textContent = "";
  const series = doc.series || [];
  ctx.lanes.update(series.map((p) => p.t_ms), ["text", "image", "stt"].map((lane) => ({
    label: lane, values: series.map((p) => (p.by_lane ? p.by_lane[lane] || 0 : 0)) })), doc.bucket_ms);
}

/** The analytics document of the period shown; in `auto` mode the period is 1h while the last hour
 * holds every request of the last 30 days (nothing older recorded), else 24h from then on. */
async function periodAnalytics(ctx) {
  if (!ctx.auto) return optional("/router/v1/site/analytics" + query({ period: ctx.period }));
  const [hour, month] = await Promise.all(["1h", "30d"].map((period) =>
    optional("/router/v1/site/analytics" + query({ period }))));
  const requests = (doc) => (doc && !doc.__error && doc.totals ? doc.totals.requests || 0 : null);
  if (requests(hour) !== null && requests(hour) === requests(month)) {
    showPeriod(ctx, "1h");
    return hour;
  }
  ctx.auto = false;
  showPeriod(ctx, "24h");
  return optional("/router/v1/site/analytics" + query({ period: "24h" }));
}

function showPeriod(ctx, period) {
  ctx.period = period;
  for (const b of ctx.periods.querySelectorAll("button")) b.classList.toggle("active", b.dataset.period === period);
}

/** Requests this node answered since it started, from its Prometheus counters (`routerd_requests_total`),
 * or null when /metrics cannot be read. */
async function metricsRequests() {
  const key = storedKey();
  try {
    const response = await fetch("/metrics", { headers: key ? { authorization: "Bearer " + key } : {} });
    if (!response.ok) return null;
    let total = 0;
    for (const line of (await response.text()).split("\n")) {
      if (line.startsWith("routerd_requests_total{") || line.startsWith("routerd_requests_total ")) {
        total += Number(line.slice(line.lastIndexOf(" ") + 1)) || 0;
      }
    }
    return total;
  } catch (err) {
    return null;
  }
}

/** Say which nodes record no analytics (their requests are missing from every figure above), with
 * each one's /metrics counters, which count whatever analytics.enabled says. */
async function renderAnalyticsOff(ctx, doc, inventory) {
  const off = ((doc && !doc.__error && doc.nodes) || []).filter((n) => n.enabled === false).map((n) => n.node_id);
  if (off.length === 0) {
    replace(ctx.off);
    return;
  }
  const nodes = new Map((inventory.nodes || []).map((n) => [n.node_id, n]));
  const here = (inventory.nodes || []).find((n) => n.role !== "slave");
  const ownCount = here && off.includes(here.node_id) ? await metricsRequests() : null;
  replace(ctx.off, h("div", { className: "analytics-off warn" },
    h("p", {}, `Analytics is off on ${off.join(", ")} (analytics.enabled: false): the figures, the chart and ` +
      "the recent requests on this page leave out what it served. Set analytics.enabled: true in its " +
      "config and reload to record them."),
    h("ul", {}, off.map((id) => {
      const node = nodes.get(id);
      const url = here && id === here.node_id ? "/metrics" : node && node.node_url ? node.node_url + "/metrics" : null;
      return h("li", { dataset: { nodeId: id } }, `${id}: its counters meanwhile at `,
        url ? h("a", { href: url, target: "_blank", rel: "noopener" }, url) : "its /metrics",
        here && id === here.node_id && ownCount !== null
          ? h("span", { className: "metrics-requests" }, ` — ${count(ownCount)} requests answered since it started`)
          : null);
    }))));
}

function attentionItems(inventory, summary, loadErrors) {
  const items = [];
  for (const node of inventory.nodes || []) {
    if (!node.healthy) items.push(["bad", "unhealthy node", `${node.node_id} (${node.node_url || ""}) does not answer its health checks`]);
  }
  for (const node of (summary && summary.nodes) || []) {
    if (node.in_sync === false) items.push(["warn", "out of sync", `${node.node_id} does not run the master's lending settings`]);
  }
  for (const e of (loadErrors && loadErrors.errors) || []) {
    items.push(["bad", "failed load", `${e.node_id}/${e.model}: ${e.reason}`]);
  }
  for (const m of inventory.models || []) {
    if (m.asset_state && m.asset_state !== "ready") {
      items.push(["warn", "unresolved assets", `${m.node_id}/${m.local_id}: ${m.asset_reason || m.asset_state}`]);
    }
  }
  return items;
}

function renderAttention(ctx, items) {
  if (items.length === 0) {
    replace(ctx.attention, h("p", { className: "empty all-clear" }, "Nothing needs attention."));
    return;
  }
  replace(ctx.attention, h("ul", { className: "attention" }, items.slice(0, 30).map(([kind, what, text]) =>
    h("li", { className: "attention-item", dataset: { kind: what } }, badge(what, kind), " ", text))),
  items.length > 30 ? h("p", { className: "empty" }, `and ${items.length - 30} more`) : null);
}

function nodeCard(node, figures, state) {
  const loaded = ((state && state.runtimes) || []).filter((r) => r.model_id && !["empty", "closed"].includes(r.state));
  return h("article", { className: "card overview-node", dataset: { nodeId: node.node_id } },
    h("header", {}, h("h2", {}, node.node_id), badge(node.role, "role"),
      badge(node.healthy ? "healthy" : "unhealthy", node.healthy ? "ok" : "bad")),
    h("div", { className: "url" }, node.node_url),
    h("div", { className: "mini-kpis" },
      h("span", {}, h("b", {}, count(figures ? figures.requests : null)), " requests"),
      h("span", {}, h("b", {}, count(figures ? figures.errors : null)), " errors"),
      h("span", {}, h("b", {}, millis(figures ? figures.p95_ms : null)), " p95"),
      h("span", {}, h("b", {}, count(figures ? figures.lent : null)), " lent"),
      h("span", {}, h("b", {}, count(figures ? figures.borrowed : null)), " borrowed")),
    h("div", { className: "loaded" }, loaded.length
      ? loaded.map((r) => badge(`${r.kind}: ${r.model_id}`, "rt-" + r.state))
      : h("span", { className: "empty" }, "nothing loaded")));
}

function flags(r) {
  // a lent request is one row: the owner's model and the helper that served it
  const lent = r.owner && r.helper ? `lent ${r.owner} → ${r.helper}` : "lent";
  return [r.lent ? badge(lent, "lent") : null, r.guardian ? badge("guardian", "warn") : null];
}

function renderFinished(ctx, doc) {
  if (!doc || doc.__error) {
    replace(ctx.finished, h("p", { className: "empty" }, "Recent requests need analytics: " + (doc ? doc.__error : "no answer")));
    return;
  }
  const rows = (doc.requests || []).slice(0, 15);
  replace(ctx.finished, rows.length
    ? table(["time", "model", "lane", "route", "status", "took", "tokens in / out", "key", ""],
      rows.map((r) => h("tr", { className: "recent-request", dataset: { requestId: r.request_id || "" } }, h("td", {}, clock(r.at_ms)),
        modelCell(r.model, r.local_id, r.node_id), h("td", {}, r.lane), h("td", {}, r.route),
        h("td", {}, badge(r.status === "ok" ? String(r.http_status || "ok") : `${r.status} ${r.http_status || ""}`, r.status === "ok" ? "ok" : "bad")),
        h("td", { className: "num" }, millis(r.duration_ms)),
        h("td", { className: "num" }, `${count(r.prompt_tokens)} / ${count(r.completion_tokens)}`),
        h("td", {}, r.key_name || ""), h("td", {}, flags(r)))), { className: "recent-finished" })
    : h("p", { className: "empty" }, "no request recorded yet"));
}

function renderRecent(ctx, states) {
  const rows = [];
  for (const state of (states && states.states) || []) {
    for (const a of state.active_requests || []) {
      rows.push(h("tr", { dataset: { key: `active/${state.node_id}/${a.request_id}` } },
        h("td", {}, state.node_id), h("td", { className: "rid" }, a.request_id),
        h("td", {}, a.model_id + (a.borrowed ? " (borrowed)" : "")), h("td", {}, a.route || ""),
        h("td", {}, badge(a.state || "active")), h("td", {}, duration(a.elapsed_ms))));
    }
    for (const r of state.held_requests || []) {
      rows.push(h("tr", { dataset: { key: `held/${state.node_id}/${r.request_id}` } },
        h("td", {}, state.node_id), h("td", { className: "rid" }, r.request_id),
        h("td", {}, r.model_id), h("td", {}, r.lane), h("td", {}, badge(r.state)), h("td", {}, duration(r.waiting_ms))));
    }
  }
  replace(ctx.recent, rows.length
    ? table(["node", "request", "model", "route / lane", "state", "for"], rows, { className: "recent" })
    : h("p", { className: "empty" }, "no request is in flight"));
}

export async function refresh(ctx) {
  const now = Date.now();
  const wantAnalytics = now - ctx.fetchedAt >= ANALYTICS_EVERY_MS;
  const [inventory, summary, states, loadErrors, analytics, recent] = await Promise.all([
    get("/router/v1/site/inventory"),
    optional("/router/v1/site/offload/summary"),
    optional("/router/v1/site/nodes/states"),
    optional("/router/v1/site/load-errors" + query({ limit: 20 })),
    wantAnalytics ? periodAnalytics(ctx) : Promise.resolve(ctx.analytics),
    optional("/router/v1/site/analytics/recent" + query({ limit: 15 })),
  ]);
  renderFinished(ctx, recent);
  if (wantAnalytics) {
    ctx.analytics = analytics;
    ctx.fetchedAt = now;
    renderKpis(ctx, analytics);
    await renderAnalyticsOff(ctx, analytics, inventory);
  }
  renderAttention(ctx, attentionItems(inventory, summary && !summary.__error ? summary : null,
    loadErrors && !loadErrors.__error ? loadErrors : null));
  const figures = new Map(((analytics && analytics.nodes) || []).map((n) => [n.node_id, n]));
  const byNode = new Map(((states && states.states) || []).map((s) => [s.node_id, s]));
  replace(ctx.cards, (inventory.nodes || []).map((n) => nodeCard(n, figures.get(n.node_id), byNode.get(n.node_id))));
  renderRecent(ctx, states && !states.__error ? states : null);
}
