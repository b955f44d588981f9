// Charts: uPlot (webui/vendor/uplot, vendored from npm at a pinned version; README "WebUI") draws
// time series; every chart has a table of the same numbers under it, so a page stays usable when
// the library cannot load (the table is then shown open). The library is imported on first use.

import { h, replace, table } from "./dom.js";

let library = null; // Promise of the uPlot class, or of null when it failed to load

function uPlotClass() {
  if (!library) {
    library = import("../vendor/uplot/uPlot.esm.js")
      .then((module) => module.default)
      .catch(() => null);
  }
  return library;
}

const COLOURS = ["#2f6fde", "#6b46c1", "#1f8a4c", "#b7791f", "#c53030", "#687385"];

function stamp(ms, bucketMs) {
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  const day = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  return bucketMs >= 86400000 ? day : `${day} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

function cell(value, digits) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return typeof value === "number" && digits !== undefined ? value.toFixed(digits) : String(value);
}

/** The x range (seconds) of a chart whose points are all at one instant `t` (seconds): `t` ± one
 * bucket, or ± an hour when the chart has no buckets (Bench). */
function instantRange(t, bucketMs) {
  const pad = (bucketMs || 3600000) / 1000;
  return { min: t - pad, max: t + pad };
}

/** A chart box: `update(times_ms, series, bucketMs)` draws `series` ([{label, values}]) against
 * `times_ms` and fills the table below it. `id` names the box (`#chart-<id>`); once drawn, the box's
 * `data-x-min` and `data-x-max` hold the x range shown (ms). */
export function chart(id, title, { unit = "", digits } = {}) {
  const plot = h("div", { className: "chart-plot" });
  const data = h("div", { className: "chart-table" });
  const details = h("details", { className: "chart-data" }, h("summary", {}, "numbers"), data);
  const el = h("figure", { className: "chart", id: "chart-" + id, dataset: { points: "0", drawn: "" } },
    h("figcaption", {}, title + (unit ? ` (${unit})` : "")), plot, details);
  const state = { plot: null, labels: "", bucketMs: 0 };

  async function draw(times, series) {
    const UPlot = await uPlotClass();
    if (!UPlot) {
      details.open = true;
      el.dataset.drawn = "table";
      return;
    }
    const labels = series.map((s) => s.label).join("\u0000");
    const values = [times.map((t) => t / 1000), ...series.map((s) => s.values.map((v) => (v === null ? null : v)))];
    const width = Math.max(280, plot.clientWidth || el.clientWidth || 560);
    if (!state.plot || state.labels !== labels) {
      if (state.plot) state.plot.destroy();
      replace(plot);
      state.labels = labels;
      state.plot = new UPlot({
        width, height: 200,
        scales: { x: { time: true } },
        legend: { live: false },
        series: [{}, ...series.map((s, i) => ({
          label: s.label, stroke: COLOURS[i % COLOURS.length], width: 2, spanGaps: false,
          points: { show: times.length < 60 },
        }))],
        axes: [{}, { size: 56 }],
        hooks: { setScale: [(u, key) => {
          if (key !== "x") return;
          el.dataset.xMin = String(Math.round(u.scales.x.min * 1000));
          el.dataset.xMax = String(Math.round(u.scales.x.max * 1000));
        }] },
      }, values, plot);
    } else {
      if (Math.abs(state.plot.width - width) > 4) state.plot.setSize({ width, height: 200 });
      state.plot.setData(values);
    }
    if (times.length > 0 && times[0] === times[times.length - 1]) {
      state.plot.setScale("x", instantRange(times[0] / 1000, state.bucketMs)); // uPlot's guess spans years
    }
    el.dataset.drawn = "uplot";
  }

  function update(times, series, bucketMs) {
    state.bucketMs = bucketMs || 0;
    el.dataset.points = String(times.length);
    const rows = times.map((t, i) => h("tr", {}, h("td", {}, stamp(t, bucketMs || 0)),
      series.map((s) => h("td", { className: "num" }, cell(s.values[i], digits)))));
    replace(data, table(["time", ...series.map((s) => s.label)], rows.reverse(), { className: "series" }));
    return draw(times, series);
  }

  return { el, update };
}
