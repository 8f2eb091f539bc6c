/* The book's offline explorers: sliders over pre-computed numbers, drawn as SVG. ASCII only
 * (non-ASCII text as \u escapes), so that a page of any encoding reads it.
 *
 * A page places one with a raw HTML block:
 *   <div class="book-explore" data-explore="damped-rotation"></div>
 * This script (loaded on every page) finds such blocks, loads the block's data file
 * _static/explore/<name>.js with a <script> tag (fetch() fails from file://; a script does not)
 * and draws it. The data files set window.BOOK_EXPLORE[name]; `python -m experiments.explore_data`
 * writes them. No kernel, no network, no library. Every number shown is read from the data file,
 * except the points of the damped rotation's spiral, which are the chapter's closed form
 * (rho^l cos l theta, rho^l sin l theta). */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var script = document.currentScript;
  var DATA_URL = script && script.src ? script.src.replace(/explore\.js(\?.*)?$/, "explore/") : "_static/explore/";
  var counter = 0;
  window.BOOK_EXPLORE = window.BOOK_EXPLORE || {};

  function svg(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function html(name, attrs, parent, text) {
    var node = document.createElement(name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function fixed(x, digits) { return Number(x).toFixed(digits); }
  function sci(x, digits) {  // 3.1e-3 style; 0 stays 0
    return x === 0 ? "0" : Number(x).toExponential(digits).replace("e+", "e");
  }
  function significant(x, digits) {
    if (x === 0) return "0";
    var a = Math.abs(x);
    return a >= 1e-3 && a < 1e5 ? String(Number(x.toPrecision(digits))) : sci(x, digits - 1);
  }

  /* A labelled slider over the indices of `values`; `show(value)` is its visible text. */
  function slider(parent, label, values, start, show, onchange) {
    var id = "book-explore-" + (++counter);
    var row = html("div", { "class": "book-explore-slider" }, parent);
    html("label", { "for": id }, row, label);
    var input = html("input", { type: "range", id: id, min: 0, max: values.length - 1, step: 1 }, row);
    input.value = start;
    var out = html("output", { "for": id, "aria-live": "off" }, row);
    function update() {
      var text = show(values[+input.value]);
      out.textContent = text;
      input.setAttribute("aria-valuetext", label + " " + text);
      onchange();
    }
    input.addEventListener("input", update);
    return { input: input, update: update, index: function () { return +input.value; },
             text: function () { return show(values[+input.value]); } };
  }

  /* ---- damped rotation: lags in span{I, J} and the best one-head line ---------------------- */
  function dampedRotation(root, data) {
    var n = data.n;
    var figure = html("div", { "class": "book-explore-figure" }, root);
    var plot = svg("svg", { viewBox: "-1.2 -1.2 2.4 2.4", role: "img", "class": "book-explore-rotation" }, figure);
    var title = svg("title", {}, plot);
    var controls = html("div", { "class": "book-explore-controls" }, root);
    var readout = html("p", { "class": "book-explore-readout", "aria-live": "polite" }, root);
    var rho, theta;
    function draw() {
      var a = rho.index(), b = theta.index();
      var r = data.radius[a], t = data.angle[b];
      var error = data.error[a][b], relative = data.relative[a][b], phi = data.direction[a][b];
      clear(plot);
      plot.appendChild(title);
      var g = svg("g", { transform: "scale(1,-1)" }, plot);  // J up
      svg("circle", { cx: 0, cy: 0, r: 1, "class": "bx-unit" }, g);
      svg("line", { x1: -1.15, y1: 0, x2: 1.15, y2: 0, "class": "bx-axis" }, g);
      svg("line", { x1: 0, y1: -1.15, x2: 0, y2: 1.15, "class": "bx-axis" }, g);
      var ux = Math.cos(phi), uy = Math.sin(phi);
      var points = [];
      for (var l = 0; l < n; l++) {
        var s = Math.pow(r, l);
        points.push([s * Math.cos(l * t), s * Math.sin(l * t)]);
      }
      points.forEach(function (p) {  // residual: from the lag to its projection on the line
        var c = p[0] * ux + p[1] * uy;
        svg("line", { x1: p[0], y1: p[1], x2: c * ux, y2: c * uy, "class": "bx-residual" }, g);
      });
      svg("line", { x1: -1.7 * ux, y1: -1.7 * uy, x2: 1.7 * ux, y2: 1.7 * uy, "class": "bx-line" }, g);
      var path = points.map(function (p, i) { return (i ? "L" : "M") + p[0].toFixed(4) + " " + p[1].toFixed(4); });
      svg("path", { d: path.join(" "), "class": "bx-spiral" }, g);
      points.forEach(function (p, l) {  // area proportional to the weight n - l
        svg("circle", { cx: p[0], cy: p[1], r: 0.045 * Math.sqrt((n - l) / n), "class": "bx-lag" }, g);
      });
      var label = svg("text", { x: 1.1, y: 0.12, "class": "bx-label" }, plot);
      label.textContent = "I";
      label = svg("text", { x: 0.05, y: -1.04, "class": "bx-label" }, plot);
      label.textContent = "J";
      var exact = relative < 1e-12;
      title.textContent = "The lags L_0 to L_" + (n - 1) + " of the damped rotation with rho = " + fixed(r, 4)
        + " and theta = " + fixed(t, 3) + " as points (rho^l cos l theta, rho^l sin l theta) of span{I, J}, "
        + "and the best single head's line through the origin at " + fixed(phi * 180 / Math.PI, 1) + " degrees.";
      plot.setAttribute("aria-label", title.textContent);
      clear(readout);
      readout.appendChild(document.createTextNode(exact
        ? "\u03b8 is a multiple of \u03c0: every lag lies on one line (k_n = 1), and one head is exact: \u03c3\u2082(G)\u00b2 = 0."
        : "One head with input-independent coefficients misses by \u03c3\u2082(G)\u00b2 = " + significant(error, 4)
          + ", a fraction " + significant(relative, 3) + " of the output energy \u2016G\u2016\u00b2_F"
          + " (relative error in norm " + significant(Math.sqrt(relative), 3) + "); n = " + n + "."));
    }
    rho = slider(controls, "\u03c1", data.radius, data.initial[0], function (v) { return fixed(v, 4); }, draw);
    theta = slider(controls, "\u03b8", data.angle, data.initial[1], function (v) { return fixed(v, 3); }, draw);
    rho.update();
    theta.update();
  }

  /* ---- heads needed: normalised squared singular values, tails, epsilon, H_eps ------------- */
  function headsNeeded(root, data) {
    var W = 640, H = 250, left = 52, right = 10, top = 12, bottom = 34, floor = -10;
    var figure = html("div", { "class": "book-explore-figure book-explore-wide" }, root);
    var plot = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "class": "book-explore-bars" }, figure);
    var title = svg("title", {}, plot);
    var controls = html("div", { "class": "book-explore-controls" }, root);
    var readout = html("p", { "class": "book-explore-readout", "aria-live": "polite" }, root);
    var Q = data.shares[0].length, step = (W - left - right) / Q;
    function y(v) {  // log10 scale from 1 (top) to 10^floor (bottom)
      var e = v > 0 ? Math.max(Math.log10(v), floor) : floor;
      return top + (H - top - bottom) * (-e / -floor);
    }
    var rho, eps;
    function draw() {
      var a = rho.index(), b = eps.index();
      var shares = data.shares[a], tails = data.tails[a], count = data.heads[a][b], epsilon = data.epsilon[b];
      clear(plot);
      plot.appendChild(title);
      for (var e = 0; e >= floor; e -= 2) {
        svg("line", { x1: left, x2: W - right, y1: y(Math.pow(10, e)), y2: y(Math.pow(10, e)), "class": "bx-grid" }, plot);
        var tick = svg("text", { x: left - 4, y: y(Math.pow(10, e)) + 4, "class": "bx-tick", "text-anchor": "end" }, plot);
        tick.textContent = e === 0 ? "1" : "1e" + e;
      }
      shares.forEach(function (v, q) {
        if (!(v > Math.pow(10, floor))) return;
        svg("rect", { x: left + q * step + 0.15 * step, width: 0.7 * step, y: y(v), height: y(0) - y(v),
                      "class": q < count ? "bx-bar bx-kept" : "bx-bar" }, plot);
      });
      var dots = [];
      for (var h = 1; h <= Q; h++) if (tails[h] > Math.pow(10, floor)) dots.push([left + (h - 0.5) * step, y(tails[h])]);
      if (dots.length) {
        svg("polyline", { points: dots.map(function (p) { return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join(" "),
                          "class": "bx-tail" }, plot);
        dots.forEach(function (p) { svg("circle", { cx: p[0], cy: p[1], r: 2.2, "class": "bx-tail-dot" }, plot); });
      }
      svg("line", { x1: left, x2: W - right, y1: y(epsilon), y2: y(epsilon), "class": "bx-eps" }, plot);
      var lab = svg("text", { x: W - right - 4, y: y(epsilon) - 4, "class": "bx-tick bx-eps-label", "text-anchor": "end" }, plot);
      lab.textContent = "\u03b5 = " + sci(epsilon, 1);
      if (count > 0) {
        var x = left + count * step;
        svg("line", { x1: x, x2: x, y1: top, y2: y(0), "class": "bx-count" }, plot);
        lab = svg("text", { x: x + 4, y: top + 12, "class": "bx-tick bx-count-label" }, plot);
        lab.textContent = "H_\u03b5 = " + count;
      }
      [1, 8, 16, 24, 32, 40, 48, 56, 64].filter(function (q) { return q <= Q; }).forEach(function (q) {
        var t = svg("text", { x: left + (q - 0.5) * step, y: H - bottom + 14, "class": "bx-tick", "text-anchor": "middle" }, plot);
        t.textContent = q;
      });
      var axis = svg("text", { x: (left + W - right) / 2, y: H - 4, "class": "bx-tick", "text-anchor": "middle" }, plot);
      axis.textContent = "q (bars: \u03c3_q(G)\u00b2 / \u2016G\u2016\u00b2_F)   \u00b7   H (dots: relative squared error of H heads)";
      title.textContent = "Bars: the normalised squared singular values of the weighted lags, q = 1 to " + Q
        + ", log scale, for rho = " + rho.text() + "; dots: the relative squared error of the best H heads; "
        + "dashed line: epsilon = " + sci(epsilon, 1) + "; " + count + " heads needed.";
      plot.setAttribute("aria-label", title.textContent);
      clear(readout);
      var left_ = tails[count];
      readout.appendChild(document.createTextNode(
        "H_\u03b5 = " + count + ", the fewest heads whose best approximation has relative squared error at most \u03b5 = "
        + sci(epsilon, 1) + ": the best " + count + " leave " + (left_ === 0 ? "less than 1e-13" : sci(left_, 2)) + " of the output energy"
        + (count > 1 ? ", the best " + (count - 1) + " leave " + sci(tails[count - 1], 2) : "")
        + ". Step \u0394 = \u22122 ln \u03c1, window T = n\u0394 = " + significant(data.window[a], 3)
        + " (N = " + data.N + ", p = d = " + data.width + ", n = " + data.n + ")."));
    }
    rho = slider(controls, "\u03c1", data.radius, data.initial[0], function (v) {  // digits enough to tell 1 - rho
      return String(Number(v.toFixed(Math.max(2, Math.ceil(-Math.log10(1 - v)) + 2))));
    }, draw);
    eps = slider(controls, "\u03b5", data.epsilon, data.initial[1], function (v) { return sci(v, 1); }, draw);
    rho.update();
    eps.update();
  }

  var DRAW = { "damped-rotation": dampedRotation, "heads-needed": headsNeeded };

  function start(root) {
    var name = root.getAttribute("data-explore");
    if (!DRAW[name] || root.getAttribute("data-drawn")) return;
    root.setAttribute("data-drawn", "loading");
    function go() {
      clear(root);
      DRAW[name](root, window.BOOK_EXPLORE[name]);
      root.setAttribute("data-drawn", "yes");
    }
    if (window.BOOK_EXPLORE[name]) return go();
    var tag = document.createElement("script");
    tag.src = DATA_URL + name + ".js";
    tag.onload = go;
    tag.onerror = function () { root.textContent = "The data of this figure (" + tag.src + ") did not load."; };
    document.head.appendChild(tag);
  }

  function startAll() { Array.prototype.forEach.call(document.querySelectorAll("div.book-explore"), start); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", startAll);
  else startAll();
})();
