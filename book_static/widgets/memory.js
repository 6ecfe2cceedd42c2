/* The memory calculator of the chapter "When the model does not fit".
 *
 * pargrad.memory.state_bytes, line for line: the bytes each device holds for
 * the parameters, their gradients, the optimizer state and the master
 * weights, at ZeRO stage 0 (plain data parallelism) to 3.  ZeRO's numbers:
 * with Psi parameters on N replicas, P and G bytes a parameter and a
 * gradient and K optimizer bytes a parameter, a device holds
 * (P + G + K) Psi at stage 0, (P + G) Psi + K Psi/N at stage 1,
 * P Psi + (G + K) Psi/N at stage 2 and (P + G + K) Psi/N at stage 3.  A
 * float32 master copy exists only under mixed precision, where it is
 * counted in K (ZeRO's 2 + 2 + 12: K = 12 for Adam, master 4 + momentum 4
 * + variance 4); in float32 and float64 the owner updates its shard in
 * place, with no second copy.  Psi/N is ceil(Psi / N); the whole parameters
 * at stages 1 and 2 are the padded flat copy, N ceil(Psi / N).  Whole numbers
 * only, so the JavaScript and the Python give the same bytes exactly;
 * tests/browser/test_memory_calculator.py checks it on a grid of inputs.
 * Plain HTML and SVG, nothing loaded from the network.  The page holds
 * <div id="pargrad-memory-calculator"></div>.
 */
(function () {
  "use strict";
  var widgets = window.pargrad.widgets;  // common.js: loaded first
  var fail = widgets.fail, el = widgets.el, text = widgets.text;

  // ---------------------------------------------------------------- arithmetic
  var PRECISIONS = ["float32", "float64", "mixed"];
  var OPTIMIZERS = ["sgd", "momentum", "adam"];
  var STATE_VALUES = {sgd: 0, momentum: 1, adam: 2};  // values of state a parameter
  var COMPONENTS = ["parameters", "gradients", "optimizer_state", "master_weights"];

  /* pargrad.checks.check_whole_number: a whole number >= minimum, exactly representable. */
  function wholeNumber(name, value, minimum) {
    return widgets.wholeNumber(name, value, minimum, true);
  }

  function choice(name, value, choices) {
    if (choices.indexOf(value) < 0) {
      fail(name + " must be one of " + choices.map(function (c) { return "'" + c + "'"; })
        .join(", ") + ", got " + value + ".");
    }
    return value;
  }

  function checkStage(stage) {
    if (!Number.isInteger(stage) || stage < 0 || stage > 3) {
      fail("stage must be one of 0, 1, 2, 3, got " + stage + ". Pass 0, 1, 2 or 3.");
    }
    return stage;
  }

  /* pargrad.memory.sharded_components. */
  function shardedComponents(stage) {
    stage = checkStage(stage);
    var names = [];
    if (stage >= 1) names.push("optimizer_state", "master_weights");
    if (stage >= 2) names.push("gradients");
    if (stage >= 3) names.push("parameters");
    return names;
  }

  /* ceil(a / b) for whole numbers, without trusting a rounded division. */
  function ceilDivide(a, b) {
    var q = Math.floor(a / b);
    while (q * b < a) q += 1;
    while (q > 0 && (q - 1) * b >= a) q -= 1;
    return q;
  }

  /* pargrad.memory.state_bytes: bytes a device holds, by component, and their total. */
  function stateBytes(parameters, replicas, stage, precision, optimizer) {
    parameters = wholeNumber("parameters", parameters, 1);
    replicas = wholeNumber("replicas", replicas, 1);
    stage = checkStage(stage);
    choice("precision", precision, PRECISIONS);
    choice("optimizer", optimizer, OPTIMIZERS);
    var value = {float32: 4, float64: 8, mixed: 2}[precision];
    var state = precision === "mixed" ? 4 : value;
    var shard = ceilDivide(parameters, replicas);
    var sharded = shardedComponents(stage);
    var count = function (component) {
      return sharded.indexOf(component) >= 0 ? shard : parameters;
    };
    var hasMaster = precision === "mixed";  // a master copy only where precision needs one
    // At stages 1 and 2 each replica's whole copy is the padded flat vector the shards
    // are cut from: N ceil(Psi / N) values (pargrad.memory.state_bytes counts the same).
    var wholeCopy = stage === 1 || stage === 2 ? replicas * shard : count("parameters");
    var held = {
      parameters: value * wholeCopy,
      gradients: value * count("gradients"),
      optimizer_state: state * STATE_VALUES[optimizer] * count("optimizer_state"),
      master_weights: hasMaster ? state * count("master_weights") : 0,
    };
    held.total = held.parameters + held.gradients + held.optimizer_state + held.master_weights;
    if (!Number.isSafeInteger(held.total)) {
      fail("parameters too large: the bytes exceed what this page counts exactly (2^53).");
    }
    return held;
  }

  window.pargrad.memory = {stateBytes: stateBytes, shardedComponents: shardedComponents,
                           COMPONENTS: COMPONENTS};

  // ------------------------------------------------------------------- the form
  /* Decimal units, as the chapter prints them (1 GB = 1e9 bytes). */
  function formatBytes(bytes) {
    var units = [[1e12, "TB"], [1e9, "GB"], [1e6, "MB"], [1e3, "kB"]];
    for (var i = 0; i < units.length; i++) {
      if (bytes >= units[i][0]) return (bytes / units[i][0]).toFixed(2) + " " + units[i][1];
    }
    return bytes + " B";
  }

  var LABELS = {parameters: "parameters", gradients: "gradients",
                optimizer_state: "optimizer state", master_weights: "master weights"};
  var STAGES = ["0: data parallelism", "1: optimizer state", "2: + gradients", "3: + parameters"];

  var FORM =
    '<fieldset><legend>Model and training</legend>' +
    '<label>parameters <input name="parameters" type="number" min="1" step="1" value="7500000000"></label>' +
    '<label>precision <select name="precision">' +
    '<option value="mixed" selected>mixed (16-bit, float32 master)</option>' +
    '<option value="float32">float32</option><option value="float64">float64</option></select></label>' +
    '<label>optimizer <select name="optimizer"><option value="adam" selected>Adam</option>' +
    '<option value="momentum">SGD with momentum</option><option value="sgd">plain SGD</option></select></label>' +
    '</fieldset>' +
    '<fieldset><legend>Devices</legend>' +
    '<label>replicas N <input name="replicas" type="number" min="1" step="1" value="64"></label>' +
    '<label>ZeRO stage <select name="stage">' + STAGES.map(function (label, stage) {
      return '<option value="' + stage + '"' + (stage === 1 ? " selected" : "") + ">" + label + "</option>";
    }).join("") + '</select></label>' +
    '</fieldset>';

  var NOTE = "As it opens: the ZeRO paper's Figure 1 (7.5 billion parameters, " +
    "mixed-precision Adam, 64 replicas). The training state only: activations, buffers " +
    "and the framework's own memory come on top.";

  function drawStages(svg, settings) {
    var width = 420, rowHeight = 26, left = 128, right = 84, top = 22;
    var height = top + 4 * rowHeight + 8;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    var totals = [0, 1, 2, 3].map(function (stage) {
      return stateBytes(settings.parameters, settings.replicas, stage, settings.precision,
                        settings.optimizer).total;
    });
    var scale = (width - left - right) / Math.max(totals[0], 1);
    text(svg, 8, 14, "bytes a device at each stage (these settings)", {class: "pc-small"});
    totals.forEach(function (total, stage) {
      var y = top + stage * rowHeight;
      text(svg, left - 6, y + 15, STAGES[stage].split(":")[0] === "0" ? "data parallel" :
           "stage " + stage, {"text-anchor": "end", class: "pc-small"});
      el("rect", {x: left, y: y + 2, width: Math.max(total * scale, 0.5), height: 18,
                  class: "pc-bar " + (stage === settings.stage ? "pm-here" : "pm-other")}, svg);
      text(svg, left + total * scale + 6, y + 15, formatBytes(total), {class: "pc-small"});
    });
  }

  function readSettings(form) {
    var number = function (name) { return Number(form.elements[name].value); };
    return {
      parameters: number("parameters"),
      replicas: number("replicas"),
      stage: number("stage"),
      precision: form.elements.precision.value,
      optimizer: form.elements.optimizer.value,
    };
  }

  function resultRows(settings, held) {
    var sharded = shardedComponents(settings.stage);
    return COMPONENTS.map(function (key) {
      var share = sharded.indexOf(key) >= 0 && held[key] > 0 ? " (1/" + settings.replicas + " a device)" : "";
      return [LABELS[key] + share, key, formatBytes(held[key])];
    }).concat([["total a device", "total", formatBytes(held.total)]]);
  }

  function build(container) {
    widgets.calculator(container, {
      form: FORM, note: NOTE,
      figures: [{className: "pm-bars", label: "bytes a device at each ZeRO stage"}],
      read: readSettings,
      compute: function (settings) {
        return stateBytes(settings.parameters, settings.replicas, settings.stage,
                          settings.precision, settings.optimizer);
      },
      keys: COMPONENTS.concat(["total"]),
      rows: resultRows,
      draw: function (svgs, settings) { drawStages(svgs[0], settings); },
    });
  }

  widgets.mount("pargrad-memory-calculator", build);
})();
