/* What the book's widgets share: playground.js, calculator.js and memory.js.
 *
 * Loaded before them (_config.yml's html_js_files), it gives
 * window.pargrad.widgets: the check helpers (fail, wholeNumber), the SVG
 * helpers (el, text) and the mounting of a widget (mount, panel, showError,
 * redrawOnEdit).  Each widget keeps its own arithmetic, drawing and
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
                 panel: panel, showError: showError, redrawOnEdit: redrawOnEdit, mount: mount};
})();
