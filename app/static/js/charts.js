/* RLGuard charts: draws uPlot charts from JSON embedded in the page.
 *
 * Markup (rendered by templates/partials/_chart.html):
 *   <div class="js-chart chart" data-kind="line|spark" data-height="180" data-spec='{"x": [...], ...}'>
 * (JSON in an attribute, not a <script>: htmx drops script elements from swapped content).
 *
 * JSON: x (unix seconds), series [{label, values, color}], unit, y {min, max},
 * bands [{from, to, level}] (null = open end) drawn behind the data, thresholds
 * [{value, label, level}] drawn as dashed lines, window [t0, t1] shaded (the evidence window).
 * Charts found in content that htmx swaps in are drawn too (htmx.onLoad), and destroyed when
 * htmx removes them, so polling partials do not leak canvases.
 */
(function () {
  "use strict";

  var LEVEL_FILL = {
    ok: "rgba(28, 124, 69, 0.10)",
    warn: "rgba(217, 145, 0, 0.14)",
    bad: "rgba(180, 35, 24, 0.12)"
  };
  var LEVEL_LINE = { ok: "#1c7c45", warn: "#b77900", bad: "#b42318" };
  var PALETTE = ["#1d5fbf", "#1c7c45", "#b42318", "#7a3fb0", "#b77900", "#0f7b8a", "#5b6474", "#c2418b"];

  // Times are shown in UTC everywhere on the dashboard, charts included.
  function utcClock(ts) {
    var text = new Date(ts * 1000).toISOString();
    return ts % 60 === 0 ? text.substring(11, 16) : text.substring(11, 19);
  }
  function utcStamp(ts) { return new Date(ts * 1000).toISOString().substring(0, 19).replace("T", " ") + " UTC"; }

  function clamp(v, lo, hi) { return Math.max(lo, Math.min(hi, v)); }

  function backgroundHook(spec) {
    return function (u) {
      var ctx = u.ctx, box = u.bbox;
      var ymin = u.scales.y.min, ymax = u.scales.y.max;
      ctx.save();
      (spec.bands || []).forEach(function (band) {
        var lo = band.from == null ? ymin : clamp(band.from, ymin, ymax);
        var hi = band.to == null ? ymax : clamp(band.to, ymin, ymax);
        if (hi <= lo) { return; }
        var top = u.valToPos(hi, "y", true), bottom = u.valToPos(lo, "y", true);
        ctx.fillStyle = LEVEL_FILL[band.level] || LEVEL_FILL.ok;
        ctx.fillRect(box.left, top, box.width, bottom - top);
      });
      if (spec.window && spec.window.length === 2) {
        var x0 = u.valToPos(clamp(spec.window[0], u.scales.x.min, u.scales.x.max), "x", true);
        var x1 = u.valToPos(clamp(spec.window[1], u.scales.x.min, u.scales.x.max), "x", true);
        ctx.fillStyle = "rgba(29, 95, 191, 0.10)";
        ctx.fillRect(x0, box.top, Math.max(x1 - x0, 2), box.height);
      }
      ctx.restore();
    };
  }

  function thresholdHook(spec) {
    return function (u) {
      var ctx = u.ctx, box = u.bbox;
      ctx.save();
      ctx.setLineDash([6, 4]);
      ctx.lineWidth = 1.5 * (window.devicePixelRatio || 1);
      (spec.thresholds || []).forEach(function (t) {
        if (t.value < u.scales.y.min || t.value > u.scales.y.max) { return; }
        var y = Math.round(u.valToPos(t.value, "y", true));
        ctx.strokeStyle = LEVEL_LINE[t.level] || LEVEL_LINE.warn;
        ctx.beginPath();
        ctx.moveTo(box.left, y);
        ctx.lineTo(box.left + box.width, y);
        ctx.stroke();
        if (t.label && spec.kind !== "spark") {
          ctx.setLineDash([]);
          ctx.fillStyle = ctx.strokeStyle;
          ctx.font = "600 " + (11 * (window.devicePixelRatio || 1)) + "px system-ui, sans-serif";
          ctx.textAlign = "right";
          ctx.textBaseline = "bottom";
          ctx.fillText(t.label, box.left + box.width - 6, y - 3);
          ctx.setLineDash([6, 4]);
        }
      });
      ctx.restore();
    };
  }

  function yRange(spec) {
    return function (u, dataMin, dataMax) {
      var lo = dataMin, hi = dataMax;
      (spec.thresholds || []).forEach(function (t) {
        if (lo == null || t.value < lo) { lo = t.value; }
        if (hi == null || t.value > hi) { hi = t.value; }
      });
      if (spec.y && spec.y.min != null) { lo = Math.min(lo == null ? spec.y.min : lo, spec.y.min); }
      if (spec.y && spec.y.max != null) { hi = Math.max(hi == null ? spec.y.max : hi, spec.y.max); }
      if (lo == null || hi == null) { return [0, 1]; }
      if (hi === lo) { hi = lo + 1; }
      var pad = spec.kind === "spark" ? 0.05 : 0.12;
      var span = hi - lo;
      var floor = (spec.y && spec.y.min != null) ? spec.y.min : lo - span * pad;
      return [Math.min(floor, lo), hi + span * pad];
    };
  }

  // The legend shows the value under the cursor; with no cursor over the chart (idx null) it
  // shows the series' latest sample instead of a dash, so a reader sees a value at once.
  function lastValue(u, si) {
    var d = u.data[si] || [];
    for (var i = d.length - 1; i >= 0; i--) { if (d[i] != null) { return d[i]; } }
    return null;
  }

  function buildOptions(el, spec, width) {
    var spark = spec.kind === "spark";
    var height = parseInt(el.getAttribute("data-height") || (spark ? "24" : "180"), 10);
    var unit = spec.unit ? " " + spec.unit : "";
    var series = [{ label: "time", value: function (u, v, si, idx) { if (idx == null) { v = lastValue(u, 0); } return v == null ? "–" : utcStamp(v); } }].concat((spec.series || []).map(function (s, i) {
      var color = s.color || PALETTE[i % PALETTE.length];
      return {
        label: s.label,
        stroke: color,
        width: spark ? 1.5 : 1.75,
        fill: spark ? color + "22" : undefined,
        spanGaps: false,
        points: { show: false },
        value: function (u, v, si, idx) { if (idx == null) { v = lastValue(u, si); } return v == null ? "–" : (+v.toFixed(3)) + unit; }
      };
    }));
    var opts = {
      width: width,
      height: height,
      series: series,
      scales: { x: { time: true }, y: { range: yRange(spec) } },
      legend: { show: !spark && series.length > 1, live: true },
      cursor: spark ? { show: false } : { drag: { x: false, y: false } },
      hooks: { drawClear: [backgroundHook(spec)], draw: [thresholdHook(spec)] },
      axes: spark
        ? [{ show: false }, { show: false }]
        : [
            {
              stroke: "#4a5568", grid: { stroke: "#eef1f5" }, ticks: { stroke: "#d9dee7" },
              values: function (u, vals) { return vals.map(utcClock); }
            },
            {
              stroke: "#4a5568", grid: { stroke: "#eef1f5" }, ticks: { stroke: "#d9dee7" }, size: 56,
              values: function (u, vals) { return vals.map(function (v) { return +v.toFixed(2) + (spec.unit === "%" ? "%" : ""); }); }
            }
          ]
    };
    if (spark) { opts.padding = [2, 0, 2, 0]; }
    return opts;
  }

  function ownSpec(el) {
    var text = el.getAttribute("data-spec");
    return text ? JSON.parse(text) : null;
  }

  // Sparklines of the node grid share one JSON document (one time axis for all nodes):
  // data-spark names its element, data-spark-series and data-spark-node pick the column.
  function sparkSpec(el) {
    var blobEl = document.getElementById(el.getAttribute("data-spark"));
    if (!blobEl) { return null; }
    if (!blobEl._parsed) { blobEl._parsed = JSON.parse(blobEl.getAttribute("data-json")); }
    var blob = blobEl._parsed;
    var values = (blob[el.getAttribute("data-spark-series")] || {})[el.getAttribute("data-spark-node")];
    return {
      x: values ? blob.x : [],
      series: [{ label: "", values: values || [] }],
      unit: el.getAttribute("data-unit") || ""
    };
  }

  function draw(el) {
    if (el._uplot || typeof uPlot === "undefined") { return; }
    var spec = el.hasAttribute("data-spark") ? sparkSpec(el) : ownSpec(el);
    if (!spec) { return; }
    spec.kind = el.getAttribute("data-kind") || spec.kind || "line";
    var x = spec.x || [];
    if (!x.length && spec.kind === "spark") { el._uplot = { destroy: function () {} }; return; }
    if (!x.length) {
      var note = document.createElement("p");
      note.className = "empty";
      note.textContent = el.getAttribute("data-empty") || "No data in this window yet.";
      el.appendChild(note);
      el._uplot = { destroy: function () {} };
      return;
    }
    var data = [x].concat((spec.series || []).map(function (s) { return s.values; }));
    var width = Math.max(el.clientWidth, 60);
    var chart = new uPlot(buildOptions(el, spec, width), data, el);
    el._uplot = chart;
    if (typeof ResizeObserver !== "undefined") {
      var ro = new ResizeObserver(function () {
        var w = Math.max(el.clientWidth, 60);
        if (Math.abs(w - chart.width) > 2) { chart.setSize({ width: w, height: chart.height }); }
      });
      ro.observe(el);
      el._uplotObserver = ro;
    }
  }

  function drawAll(root) {
    var scope = root && root.querySelectorAll ? root : document;
    if (scope.classList && scope.classList.contains("js-chart")) { draw(scope); }
    scope.querySelectorAll(".js-chart").forEach(draw);
  }

  function destroy(el) {
    if (el._uplotObserver) { el._uplotObserver.disconnect(); el._uplotObserver = null; }
    if (el._uplot) { el._uplot.destroy(); el._uplot = null; }
  }

  document.addEventListener("htmx:beforeCleanupElement", function (evt) {
    var el = evt.target;
    if (el && el._uplot) { destroy(el); }
  });

  if (window.htmx) {
    window.htmx.onLoad(drawAll);
  } else {
    document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  }
  window.RLGuardCharts = { drawAll: drawAll };
})();
