/* looprl dashboard: draws a page's charts with uPlot from their JSON blocks
   (<figure data-chart=ID> + <script type="application/json" id=ID>, see render.py) and, when the
   page asks for it (<body data-refresh=N>), reloads the page's data in place every N seconds:
   charts get the new points and keep their zoom; [data-live] blocks are swapped, keeping ticked
   boxes and opened <details>. It talks to nothing but the page's own URL. */
(function () {
  "use strict";
  var COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#ae3ec9", "#e8590c", "#0b7285", "#c2255c",
                "#5c940d", "#364fc7", "#862e9c"];
  var HEIGHT = 210;
  var STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000];
  var charts = {};

  function fmt(v, digits) {
    if (v === null || v === undefined) return "—";
    var d = digits || 4, a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(d - 1);
    return String(+v.toPrecision(d));
  }

  /* y tick labels with the significant digits that tell ticks apart (uPlot's default rounds
     a narrow range such as 0.002331..0.002339 to one repeated label). */
  function tickLabels(u, splits) {
    for (var d = 4; d < 12; d++) {
      var labels = splits.map(function (v) { return fmt(v, d); });
      if (new Set(labels).size === labels.length) return labels;
    }
    return labels;
  }

  /* Room for the longest tick label of a y axis. */
  function axisWidth(u, values) {
    var n = 4;
    (values || []).forEach(function (v) { n = Math.max(n, String(v).length); });
    return 14 + 7 * n;
  }

  /* Rates and fractions: at least [0, 1]. */
  function unitRange(u, lo, hi) {
    return [Math.min(0, lo === null ? 0 : lo), Math.max(1, hi === null ? 1 : hi)];
  }

  /* Other values: uPlot's padded range, but a flat line sits mid-chart (not on a 0..100 axis). */
  function valueRange(u, lo, hi) {
    if (lo === null || hi === null) return [0, 1];
    if (lo === hi) {
      var pad = lo === 0 ? 1 : Math.abs(lo) * 0.1;
      return [lo - pad, hi + pad];
    }
    return uPlot.rangeNum(lo, hi, 0.1, true);
  }

  function columns(spec) {
    return [spec.x].concat(spec.series.map(function (s) { return s.values; }));
  }

  /* Grey bands behind the steps that trained on nothing (spec.skipped). */
  function skippedBands(state) {
    return {
      hooks: {
        drawClear: function (u) {
          var xs = state.spec.skipped;
          if (!xs || !xs.length) return;
          var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
          var half = Math.max(2, Math.abs(u.valToPos(1, "x", true) - u.valToPos(0, "x", true)) / 2);
          ctx.save();
          ctx.fillStyle = "rgba(120, 120, 130, 0.16)";
          xs.forEach(function (x) {
            var px = u.valToPos(x, "x", true);
            ctx.fillRect(px - half, top, 2 * half, h);
          });
          ctx.restore();
        }
      }
    };
  }

  function make(fig) {
    var id = fig.getAttribute("data-chart");
    var block = document.getElementById(id);
    if (!block) return;
    var state = {spec: JSON.parse(block.textContent)};
    var spec = state.spec;
    var steps = spec.xlabel === "step";
    var opts = {
      width: Math.max(240, fig.clientWidth - 4),
      height: HEIGHT,
      plugins: [skippedBands(state)],
      cursor: {sync: {key: "looprl"}, drag: {x: true, y: false}},
      scales: {x: {time: false}, y: {range: spec.unit ? unitRange : valueRange}},
      legend: {live: true},
      axes: [{label: spec.xlabel, labelSize: 16, size: 36, font: "11px system-ui",
              labelFont: "11px system-ui", incrs: steps ? STEP_INCRS : undefined},
             {font: "11px system-ui", size: axisWidth, values: tickLabels}],
      series: [{label: spec.xlabel, value: function (u, v) { return fmt(v); }}].concat(
        spec.series.map(function (s, i) {
          return {label: s.label, stroke: COLORS[i % COLORS.length], width: 1.6, spanGaps: false,
                  points: {show: true, size: 5}, value: function (u, v) { return fmt(v); }};
        }))
    };
    state.u = new uPlot(opts, columns(spec), fig);
    charts[id] = state;
  }

  function drawAll() {
    document.querySelectorAll("[data-chart]").forEach(make);
    window.addEventListener("resize", function () {
      document.querySelectorAll("[data-chart]").forEach(function (fig) {
        var c = charts[fig.getAttribute("data-chart")];
        if (c) c.u.setSize({width: Math.max(240, fig.clientWidth - 4), height: HEIGHT});
      });
    });
  }

  function topLive(root) {
    return Array.prototype.filter.call(root.querySelectorAll("[data-live]"), function (el) {
      return !el.parentElement || !el.parentElement.closest("[data-live]");
    });
  }

  function swap(old, fresh) {
    var ticked = {};
    old.querySelectorAll("input[type=checkbox]").forEach(function (c) {
      ticked[c.name + "=" + c.value] = c.checked;
    });
    var opened = Array.prototype.map.call(old.querySelectorAll("details"), function (d) { return d.open; });
    var node = document.importNode(fresh, true);
    node.querySelectorAll("input[type=checkbox]").forEach(function (c) {
      var k = c.name + "=" + c.value;
      if (k in ticked) c.checked = ticked[k];
    });
    node.querySelectorAll("details").forEach(function (d, i) { if (i < opened.length) d.open = opened[i]; });
    old.replaceWith(node);
  }

  function update(doc) {
    var ids = Array.prototype.map.call(doc.querySelectorAll("[data-chart]"),
                                       function (f) { return f.getAttribute("data-chart"); });
    var oldLive = topLive(document), newLive = topLive(doc);
    var same = ids.join("\n") === Object.keys(charts).join("\n") && oldLive.length === newLive.length;
    var specs = {};
    ids.forEach(function (id) { specs[id] = JSON.parse(doc.getElementById(id).textContent); });
    same = same && ids.every(function (id) {
      return specs[id].series.map(function (s) { return s.label; }).join("\n") ===
             charts[id].spec.series.map(function (s) { return s.label; }).join("\n");
    });
    if (!same) { window.location.reload(); return; }  // a panel or a line appeared: redraw all
    ids.forEach(function (id) {
      var c = charts[id], x = c.spec.x, sc = c.u.scales.x;
      var zoomed = x.length > 1 && (sc.min > x[0] || sc.max < x[x.length - 1]);
      c.spec = specs[id];
      document.getElementById(id).textContent = JSON.stringify(specs[id]);
      c.u.setData(columns(specs[id]), !zoomed);
    });
    oldLive.forEach(function (el, i) { swap(el, newLive[i]); });
  }

  function refresher(seconds) {
    function tick() {
      fetch(window.location.href, {credentials: "same-origin", cache: "no-store"})
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.text();
        })
        .then(function (text) { update(new DOMParser().parseFromString(text, "text/html")); })
        .catch(function (e) {
          var note = document.getElementById("note");
          if (note) note.textContent = "could not refresh (" + e.message + "); retrying";
        })
        .then(function () { window.setTimeout(tick, seconds * 1000); });
    }
    window.setTimeout(tick, seconds * 1000);
  }

  function start() {
    drawAll();
    var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
    if (seconds > 0) refresher(seconds);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
