/* The staleness playground of the chapter "Asynchronous training".
 *
 * Gradient descent with a delayed gradient on a quadratic, L(w) = λ w² / 2
 * (w measured from the minimum): w(t+1) = w(t) − ηλ w(t − τ).  The
 * arithmetic is pargrad/book/delay.py's, line for line; tests/browser checks
 * that both give the same numbers.  Plain SVG, nothing loaded from the
 * network.  The page holds <div id="pargrad-staleness-playground"></div>.
 */
(function () {
  "use strict";
  var widgets = window.pargrad.widgets;  // common.js: loaded first
  var el = widgets.el, text = widgets.text;

  // ---------------------------------------------------------------- arithmetic
  function checkStaleness(staleness) {
    if (!Number.isInteger(staleness) || staleness < 0) {
      throw new Error("staleness (in updates; 0 = fresh) must be a whole number >= 0, got " +
                      staleness + ".");
    }
    return staleness;
  }

  /* The largest ηλ for which w(t+1) = w(t) − ηλ w(t − τ) converges:
   * 2 sin(π / (2 (2τ + 1))).  pargrad.book.delay.stable_rate_bound. */
  function stableRateBound(staleness) {
    staleness = checkStaleness(staleness);
    return 2.0 * Math.sin(Math.PI / (2.0 * (2 * staleness + 1)));
  }

  /* The parameter after each update, w(0) = start first; before τ updates
   * have landed every gradient was computed at the start.
   * pargrad.book.delay.delayed_gradient_path. */
  function delayedGradientPath(rateTimesCurvature, staleness, start, updates) {
    staleness = checkStaleness(staleness);
    if (!Number.isInteger(updates) || updates < 0) {
      throw new Error("updates must be a whole number >= 0, got " + updates + ".");
    }
    var path = new Array(updates + 1);
    path[0] = Number(start);
    for (var t = 0; t < updates; t++) {
      var read = path[Math.max(t - staleness, 0)];
      path[t + 1] = path[t] - Number(rateTimesCurvature) * read;
    }
    return path;
  }

  /* The three runs the chapter compares, for W = τ + 1 equal workers, over
   * the same number of gradients: stale (asynchronous: each update's gradient
   * is τ updates old), fresh (the same updates one after the other, each
   * gradient fresh) and synchronous (one step a round of W gradients, the
   * average of W gradients all taken at the same point). */
  function threeRuns(rateTimesCurvature, staleness, start, gradients) {
    var workers = staleness + 1;
    var stale = delayedGradientPath(rateTimesCurvature, staleness, start, gradients);
    var fresh = delayedGradientPath(rateTimesCurvature, 0, start, gradients);
    var sync = delayedGradientPath(rateTimesCurvature, 0, start, Math.floor(gradients / workers));
    return {stale: stale, fresh: fresh, sync: sync, workers: workers};
  }

  window.pargrad.delay = {stableRateBound: stableRateBound, delayedGradientPath: delayedGradientPath,
                          threeRuns: threeRuns};

  // ------------------------------------------------------------------- drawing
  var GRADIENTS = 40;

  function slider(form, name, label, min, max, step, value) {
    var row = document.createElement("label");
    row.className = "pg-row";
    row.innerHTML = '<span class="pg-label"></span>' +
      '<input type="range" name="' + name + '" min="' + min + '" max="' + max +
      '" step="' + step + '" value="' + value + '">' + '<output name="' + name + '-value"></output>';
    row.querySelector(".pg-label").textContent = label;
    form.appendChild(row);
    return row.querySelector("input");
  }

  function format(value, digits) {
    if (!isFinite(value)) return value > 0 ? "∞" : (value < 0 ? "−∞" : "NaN");
    return value.toFixed(digits).replace("-", "−");
  }

  var LOSS = 0.5;  // L(w) = w² / 2: λ = 1 on the picture; the paths depend only on ηλ.

  function drawBalls(svg, run, start) {
    var width = 420, height = 260, left = 40, right = 10, top = 24, bottom = 34;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    var span = Math.max(Math.abs(start), 0.5) * 1.6;
    var xOf = function (w) { return left + (w + span) / (2 * span) * (width - left - right); };
    var top_loss = LOSS * span * span;
    var yOf = function (loss) { return height - bottom - loss / top_loss * (height - top - bottom); };
    el("line", {x1: left, y1: height - bottom, x2: width - right, y2: height - bottom,
                class: "pg-axis"}, svg);
    var points = [];
    for (var i = 0; i <= 120; i++) {
      var w = -span + 2 * span * i / 120;
      points.push(xOf(w).toFixed(2) + "," + yOf(LOSS * w * w).toFixed(2));
    }
    el("polyline", {points: points.join(" "), class: "pg-curve"}, svg);
    text(svg, xOf(0), height - bottom + 14, "minimum", {"text-anchor": "middle", class: "pg-small"});
    text(svg, width - right, height - 6, "w (from the minimum)", {"text-anchor": "end", class: "pg-small"});
    text(svg, left - 4, top + 8, "loss", {"text-anchor": "end", class: "pg-small"});
    // The first round: every worker read w(0); the updates land one after another.
    var round = run.stale.slice(0, run.workers + 1);
    for (var k = 0; k < round.length; k++) {
      var wk = round[k];
      var shown = Math.max(-span, Math.min(span, wk));
      var colour = k === 0 ? "black" : (k === round.length - 1 ? "white" : "gray");
      var ball = el("circle", {cx: xOf(shown), cy: yOf(LOSS * shown * shown) - 7, r: 7,
                               class: "pg-ball pg-" + colour, "data-update": k,
                               "data-w": wk}, svg);
      var title = el("title", {}, ball);
      title.textContent = "after " + k + " update" + (k === 1 ? "" : "s") + ": w = " + format(wk, 3);
      if (shown !== wk) {  // off the picture: an arrow at the edge
        text(svg, xOf(shown) + (wk > 0 ? -14 : 14), yOf(LOSS * shown * shown) + 14,
             wk > 0 ? "→ off the picture" : "off the picture ←",
             {"text-anchor": wk > 0 ? "end" : "start", class: "pg-small"});
      }
    }
    // Where the fresh and the synchronous runs are after the same W gradients.
    var marks = [["fresh", run.fresh[run.workers]], ["sync", run.sync[1]]];
    marks.forEach(function (mark) {
      var shown = Math.max(-span, Math.min(span, mark[1]));
      el("path", {d: "M" + (xOf(shown) - 5) + "," + (height - bottom + 2) + " l5,-8 l5,8 z",
                  class: "pg-mark pg-mark-" + mark[0], "data-w": mark[1]}, svg);
    });
  }

  function logScale(value, low, high) {
    var clipped = Math.max(low, Math.min(high, value));
    return (Math.log10(clipped) - Math.log10(low)) / (Math.log10(high) - Math.log10(low));
  }

  function drawLosses(svg, run) {
    var width = 420, height = 260, left = 50, right = 10, top = 12, bottom = 34;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    var low = 1e-8, high = 1e8;
    var xOf = function (g) { return left + g / GRADIENTS * (width - left - right); };
    var yOf = function (relative) {
      return height - bottom - logScale(relative, low, high) * (height - top - bottom);
    };
    el("line", {x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, class: "pg-axis"}, svg);
    el("line", {x1: left, y1: top, x2: left, y2: height - bottom, class: "pg-axis"}, svg);
    [1e-8, 1e-4, 1, 1e4, 1e8].forEach(function (tick) {
      el("line", {x1: left, y1: yOf(tick), x2: width - right, y2: yOf(tick), class: "pg-grid"}, svg);
      text(svg, left - 4, yOf(tick) + 4, tick === 1 ? "1" : "1e" + Math.log10(tick),
           {"text-anchor": "end", class: "pg-small"});
    });
    text(svg, (left + width) / 2, height - 6, "gradients computed (W a round)",
         {"text-anchor": "middle", class: "pg-small"});
    text(svg, left + 4, top + 10, "loss / loss at the start", {class: "pg-small"});
    var start = run.stale[0];
    function relative(w) { return start === 0 ? 1 : (w * w) / (start * start); }
    var series = [
      ["stale", run.stale.map(function (w, g) { return [g, relative(w)]; })],
      ["fresh", run.fresh.map(function (w, g) { return [g, relative(w)]; })],
      ["sync", run.sync.map(function (w, s) { return [s * run.workers, relative(w)]; })],
    ];
    series.forEach(function (entry) {
      var points = entry[1].map(function (p) {
        return xOf(p[0]).toFixed(2) + "," + yOf(p[1]).toFixed(2);
      });
      el("polyline", {points: points.join(" "), class: "pg-line pg-line-" + entry[0]}, svg);
    });
  }

  function drawBound(svg, rate, staleness, maxStaleness, maxRate) {
    var width = 420, height = 170, left = 46, right = 10, top = 10, bottom = 34;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    var xOf = function (tau) { return left + tau / maxStaleness * (width - left - right); };
    var yOf = function (r) { return height - bottom - r / maxRate * (height - top - bottom); };
    var points = [];
    for (var tau = 0; tau <= maxStaleness; tau++) {
      points.push(xOf(tau).toFixed(2) + "," + yOf(stableRateBound(tau)).toFixed(2));
    }
    el("polygon", {points: xOf(0) + "," + yOf(0) + " " + points.join(" ") + " " +
                   xOf(maxStaleness) + "," + yOf(0), class: "pg-stable"}, svg);
    el("polyline", {points: points.join(" "), class: "pg-bound"}, svg);
    el("line", {x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, class: "pg-axis"}, svg);
    el("line", {x1: left, y1: top, x2: left, y2: height - bottom, class: "pg-axis"}, svg);
    [0, 1, 2].forEach(function (r) {
      text(svg, left - 4, yOf(r) + 4, String(r), {"text-anchor": "end", class: "pg-small"});
    });
    for (var t = 0; t <= maxStaleness; t += 3) {
      text(svg, xOf(t), height - bottom + 14, String(t), {"text-anchor": "middle", class: "pg-small"});
    }
    text(svg, (left + width) / 2, height - 4, "staleness τ", {"text-anchor": "middle", class: "pg-small"});
    text(svg, left + 6, top + 10, "ηλ; shaded: the stale run converges", {class: "pg-small"});
    var stable = rate < stableRateBound(staleness);
    el("circle", {cx: xOf(staleness), cy: yOf(Math.min(rate, maxRate)), r: 5,
                  class: stable ? "pg-here" : "pg-here pg-unstable"}, svg);
  }

  function build(container) {
    var form = widgets.controls(container, "pg-controls");
    var rate = slider(form, "rate", "learning rate × curvature ηλ", 0.02, 2.2, 0.02, 0.6);
    var staleness = slider(form, "staleness", "staleness τ (W = τ + 1 equal workers)", 0, 15, 1, 1);
    var start = slider(form, "start", "starting point w(0)", -3, 3, 0.1, 3);
    var status = document.createElement("p");
    status.className = "pg-status";
    status.setAttribute("aria-live", "polite");
    container.appendChild(status);
    var figures = document.createElement("div");
    figures.className = "pg-figures";
    container.appendChild(figures);
    var balls = el("svg", {class: "pg-svg pg-balls", role: "img",
                           "aria-label": "the loss curve with the balls of the first round"});
    var losses = el("svg", {class: "pg-svg pg-losses", role: "img",
                            "aria-label": "loss over gradients for the three runs"});
    var bound = el("svg", {class: "pg-svg pg-bound-chart", role: "img",
                           "aria-label": "the stability bound against the staleness"});
    figures.appendChild(balls);
    figures.appendChild(losses);
    figures.appendChild(bound);
    var legend = document.createElement("p");
    legend.className = "pg-legend";
    legend.innerHTML =
      '<span class="pg-key pg-key-stale"></span>stale (asynchronous) ' +
      '<span class="pg-key pg-key-fresh"></span>the same updates, fresh ' +
      '<span class="pg-key pg-key-sync"></span>synchronous (one step a round). ' +
      'Balls: black w(0), gray the updates between, white after the round of W updates ' +
      'computed at w(0); triangles: where the fresh (green) and synchronous (blue) runs are ' +
      'after the same W gradients.';
    container.appendChild(legend);

    function redraw() {
      var r = Number(rate.value), tau = Number(staleness.value), w0 = Number(start.value);
      form.querySelector('output[name="rate-value"]').textContent = r.toFixed(2);
      form.querySelector('output[name="staleness-value"]').textContent = tau + " (W = " + (tau + 1) + ")";
      form.querySelector('output[name="start-value"]').textContent = format(w0, 1);
      var run = threeRuns(r, tau, w0, GRADIENTS);
      var limit = stableRateBound(tau);
      var stable = r < limit;
      container.dataset.rate = r;
      container.dataset.staleness = tau;
      container.dataset.start = w0;
      container.dataset.bound = limit;
      container.dataset.stable = stable;
      container.dataset.roundEnd = run.stale[run.workers];
      container.dataset.lastStale = run.stale[GRADIENTS];
      status.classList.toggle("pg-warning", !stable);
      status.textContent = "Bound for τ = " + tau + ": ηλ < 2 sin(π / (2(2τ + 1))) = " +
        limit.toFixed(4) + ". " + (stable
          ? "The stale run converges (ηλ = " + r.toFixed(2) + ")."
          : "Unstable: ηλ = " + r.toFixed(2) + " is past the bound; the stale run diverges.") +
        " After the first round of " + (tau + 1) + " update" + (tau ? "s" : "") +
        ": stale w = " + format(run.stale[run.workers], 3) +
        ", fresh w = " + format(run.fresh[run.workers], 3) +
        ", synchronous w = " + format(run.sync[1], 3) + ".";
      [balls, losses, bound].forEach(function (svg) { svg.innerHTML = ""; });
      drawBalls(balls, run, w0);
      drawLosses(losses, run);
      drawBound(bound, r, tau, Number(staleness.max), Number(rate.max));
    }

    widgets.redrawOnEdit(form, redraw);
  }

  widgets.mount("pargrad-staleness-playground", build);
})();
