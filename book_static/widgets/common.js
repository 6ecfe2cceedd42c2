/* What the book's widgets share: playground.js, calculator.js and memory.js.
 *
 * Loaded before them (_config.yml's html_js_files), it gives
 * window.pargrad.widgets: the check helpers (fail, wholeNumber), the SVG
 * helpers (el, text), the mounting of a widget (mount, panel, showError,
 * redrawOnEdit) and the one form-building code of the two calculators
 * (calculator).  Each widget keeps its own arithmetic, drawing and
 * settings.  Plain DOM, nothing loaded from the network.
 */
(function () {
  "use strict";

  // ------------------------------------------------------------------- checks
  function fail(message) { throw new Error(message); }

  /* A whole number >= minimum, as pargrad.checks.check_whole_number; with
   * exact, also below 2^53, so that sums of it stay exact. */
  function wholeNumber(name, value, minimum, exact) {
    if (!(exact ? Number.isSafeInteger(value) : Number.isInteger(value)) || value < minimum) {
      fail(name + " must be a whole number >= " + minimum + ", got " + value + ".");
    }
    return value;
  }

  // ---------------------------------------------------------------------- SVG
  var SVG = "http://www.w3.org/2000/svg";

  /* A new SVG element with these attributes, appended to parent if given. */
  function el(name, attributes, parent) {
    var node = document.createElementNS(SVG, name);
    for (var key in attributes) node.setAttribute(key, attributes[key]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, attributes) {
    var node = el("text", Object.assign({x: x, y: y}, attributes || {}), parent);
    node.textContent = content;
    return node;
  }

  // ----------------------------------------------------------------- mounting
  /* A form of this class (holding html, if given) appended to container;
   * pressing Enter in it does not reload the page. */
  function controls(container, className, html) {
    var form = document.createElement("form");
    form.className = className;
    if (html) form.innerHTML = html;
    form.addEventListener("submit", function (event) { event.preventDefault(); });
    container.appendChild(form);
    return form;
  }

  /* The calculators' layout: the form (HTML), a note under it, and the
   * output that screen readers announce when it changes. */
  function panel(container, options) {
    var form = controls(container, "pc-controls", options.form);
    var note = document.createElement("p");
    note.className = "pg-legend";
    note.textContent = options.note;
    container.appendChild(note);
    var output = document.createElement("div");
    output.className = "pc-output";
    output.setAttribute("aria-live", "polite");
    container.appendChild(output);
    return {form: form, output: output};
  }

  /* A setting the arithmetic refused: its message in the output and in
   * data-error, and the figures emptied. */
  function showError(container, output, error, figures) {
    output.innerHTML = '<p class="pc-error"></p>';
    output.firstChild.textContent = error.message;
    container.dataset.error = error.message;
    figures.forEach(function (svg) { svg.innerHTML = ""; });
  }

  /* Draw now, and again on every edit of the form. */
  function redrawOnEdit(form, redraw) {
    form.addEventListener("input", redraw);
    form.addEventListener("change", redraw);
    redraw();
  }

  /* A table of rows [label, key, shown]: each value in <td data-key=key>. */
  function resultTable(rows) {
    return '<table class="pc-table"><tbody>' + rows.map(function (row) {
      return '<tr><th>' + row[0] + '</th><td data-key="' + row[1] + '">' + row[2] + '</td></tr>';
    }).join("") + '</tbody></table>';
  }

  /* A calculator built into container, the one build of calculator.js and
   * memory.js: the panel (spec.form, spec.note), one SVG a spec.figures
   * entry ({className, label}) side by side, and a redraw on every edit
   * that reads the form (spec.read(form) -> settings), computes
   * (spec.compute(settings) -> result), copies spec.keys of the result
   * into the container's data attributes, shows spec.rows(settings,
   * result) as a table and draws (spec.draw(svgs, settings, result)); a
   * refusal of read or compute is shown instead (showError).
   * spec.beforeRedraw(form, container), if given, runs first. */
  function calculator(container, spec) {
    var parts = panel(container, {form: spec.form, note: spec.note});
    var figures = document.createElement("div");
    figures.className = "pg-figures";
    var svgs = spec.figures.map(function (figure) {
      return el("svg", {class: "pc-svg " + figure.className, role: "img",
                        "aria-label": figure.label}, figures);
    });
    container.appendChild(figures);

    function redraw() {
      if (spec.beforeRedraw) spec.beforeRedraw(parts.form, container);
      var settings, result;
      try {
        settings = spec.read(parts.form);
        result = spec.compute(settings);
      } catch (error) {
        showError(container, parts.output, error, svgs);
        return;
      }
      delete container.dataset.error;
      spec.keys.forEach(function (key) { container.dataset[key] = result[key]; });
      parts.output.innerHTML = resultTable(spec.rows(settings, result));
      svgs.forEach(function (svg) { svg.innerHTML = ""; });
      spec.draw(svgs, settings, result);
    }

    redrawOnEdit(parts.form, redraw);
  }

  /* Once the page is read, build(container) into the element of this id, if
   * the page has one, emptied and marked as a widget. */
  function mount(containerId, build) {
    function start() {
      var container = document.getElementById(containerId);
      if (!container) return;
      container.classList.add("pargrad-widget");
      container.innerHTML = "";
      build(container);
    }
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
    else start();
  }

  var api = window.pargrad = window.pargrad || {};
  api.widgets = {fail: fail, wholeNumber: wholeNumber, el: el, text: text, controls: controls,
                 panel: panel, showError: showError, redrawOnEdit: redrawOnEdit,
                 calculator: calculator, mount: mount};
})();
