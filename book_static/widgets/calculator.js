/* The scaling calculator of the chapter "What communication costs".
 *
 * The α–β model of pargrad/cost.py, line for line: a message of n bytes
 * costs α + n/β; an algorithm is a count of messages one after another and a
 * multiple of n through its busiest link.  tests/browser checks that this
 * file and pargrad.cost give the same numbers, and that the link presets
 * are the chapter's table.  Plain HTML and SVG, nothing loaded from the
 * network.  The page holds <div id="pargrad-scaling-calculator"></div>.
 */
(function () {
  "use strict";
  var widgets = window.pargrad.widgets;  // common.js: loaded first
  var fail = widgets.fail, wholeNumber = widgets.wholeNumber;
  var el = widgets.el, text = widgets.text;

  // ---------------------------------------------------------------- arithmetic
  function positive(name, value, unit) {
    if (typeof value !== "number" || !(value > 0) || !isFinite(value)) {
      fail(name + " must be a positive number of " + unit + ", got " + value + ".");
    }
    return value;
  }

  function notNegative(name, value, unit) {
    if (typeof value !== "number" || !isFinite(value) || value < 0) {
      fail(name + " must be a number of " + unit + " >= 0, got " + value + ".");
    }
    return value;
  }

  /* pargrad.cost.Link: latency α (seconds a message), bandwidth β (bytes a second). */
  function link(latency, bandwidth, name) {
    if (typeof latency !== "number" || !(latency >= 0) || !isFinite(latency)) {
      fail("latency must be seconds >= 0 (for example 5e-6), got " + latency + ".");
    }
    positive("bandwidth", bandwidth, "bytes per second (for example 25e9)");
    return {latency: latency, bandwidth: bandwidth, name: name || ""};
  }

  /* pargrad.cost.Pattern.time: messages * α + traffic * n / β. */
  function patternTime(pattern, nbytes, through) {
    nbytes = notNegative("nbytes", nbytes, "bytes");
    return pattern.messages * through.latency + pattern.traffic * nbytes / through.bandwidth;
  }

  function ringPattern(replicas) {
    replicas = wholeNumber("replicas", replicas, 1);
    var steps = 2 * (replicas - 1);
    return {messages: steps, traffic: steps / replicas};
  }

  function ceilLog2(value) {  // ceil(log2 value) for a whole number >= 1, without rounding
    var rounds = 0;
    while (Math.pow(2, rounds) < value) rounds++;
    return rounds;
  }

  function treePattern(replicas) {
    replicas = wholeNumber("replicas", replicas, 1);
    var rounds = 2 * ceilLog2(replicas);
    return {messages: rounds, traffic: rounds};
  }

  function parameterServerPattern(workers, servers) {
    workers = wholeNumber("workers", workers, 1);
    servers = wholeNumber("servers", servers, 1);
    return {messages: 2, traffic: 2 * Math.max(1.0, workers / servers)};
  }

  function messageTime(nbytes, through) {
    return patternTime({messages: 1, traffic: 1.0}, nbytes, through);
  }

  function ringAllReduceTime(nbytes, replicas, through) {
    return patternTime(ringPattern(replicas), nbytes, through);
  }

  function treeAllReduceTime(nbytes, replicas, through) {
    return patternTime(treePattern(replicas), nbytes, through);
  }

  function hierarchicalAllReduceTime(nbytes, replicasPerBox, boxes, inside, across) {
    var insideTime = ringAllReduceTime(nbytes, replicasPerBox, inside);
    var acrossTime = ringAllReduceTime(nbytes, boxes, across);
    return insideTime + acrossTime;
  }

  function parameterServerTime(nbytes, workers, servers, through) {
    return patternTime(parameterServerPattern(workers, servers), nbytes, through);
  }

  /* pargrad.cost.step_time: compute plus the communication not hidden behind it. */
  function stepTime(compute, communication, overlap) {
    compute = notNegative("compute", compute, "seconds");
    communication = notNegative("communication", communication, "seconds");
    overlap = overlap === undefined ? 0.0 : overlap;
    if (typeof overlap !== "number" || !(overlap >= 0 && overlap <= 1)) {
      fail("overlap must be a share from 0 to 1, got " + overlap + ". 0 hides nothing, 1 all of it.");
    }
    var hidden = Math.min(overlap * communication, compute);
    return compute + communication - hidden;
  }

  function scalingEfficiency(oneReplicaStepTime, manyReplicasStepTime) {
    var one = positive("one_replica_step_time", oneReplicaStepTime, "seconds");
    var many = positive("many_replicas_step_time", manyReplicasStepTime, "seconds");
    return one / many;
  }

  /* pargrad.cost.smallest_batch_for_efficiency. */
  function smallestBatchForEfficiency(secondsPerExample, communication, efficiency, overlap) {
    secondsPerExample = positive("seconds_per_example", secondsPerExample, "seconds");
    communication = notNegative("communication", communication, "seconds");
    if (typeof efficiency !== "number" || !(efficiency > 0 && efficiency < 1)) {
      fail("efficiency must be a share strictly between 0 and 1, got " + efficiency + ". Pass 0.9 for 90%.");
    }
    overlap = overlap === undefined ? 0.0 : overlap;
    stepTime(0.0, 0.0, overlap);
    if (communication === 0) return 1;
    var compute = efficiency <= overlap
      ? efficiency * communication
      : efficiency * (1 - overlap) * communication / (1 - efficiency);
    var batch = Math.max(1, Math.ceil(compute / secondsPerExample));
    function reaches(examples) {
      var seconds = examples * secondsPerExample;
      return scalingEfficiency(seconds, stepTime(seconds, communication, overlap)) >= efficiency;
    }
    while (batch > 1 && reaches(batch - 1)) batch -= 1;
    while (!reaches(batch)) batch += 1;
    return batch;
  }

  /* The links of the chapter's table "Predicting real hardware": vendors'
   * peak bandwidths a direction, assumed latencies.  Same expressions as the
   * chapter's cell, so the same floats. */
  var GB = 1e9;
  var LINKS = [
    link(5e-6, 16e9 * 16 * 128 / 130 / 8, "PCIe 4.0 x16"),
    link(5e-6, 32e9 * 16 * 128 / 130 / 8, "PCIe 5.0 x16"),
    link(5e-6, 600 * GB / 2, "NVLink A100"),
    link(5e-6, 900 * GB / 2, "NVLink H100"),
    link(5e-6, 200e9 / 8, "InfiniBand HDR"),
    link(5e-6, 400e9 / 8, "InfiniBand NDR"),
    link(20e-6, 25e9 / 8, "25 GbE"),
    link(20e-6, 100e9 / 8, "100 GbE"),
  ];

  /* One data-parallel step as the calculator reads its inputs: the seconds
   * of compute and of communication, the step, its efficiency, and the
   * smallest per-replica batch that keeps `target` efficiency. */
  function dataParallelStep(settings) {
    var nbytes = settings.parameters * settings.bytesPerParameter;
    var replicas = wholeNumber("replicas", settings.replicas, 1);
    var communication;
    if (settings.algorithm === "ring") {
      communication = ringAllReduceTime(nbytes, replicas, settings.link);
    } else if (settings.algorithm === "tree") {
      communication = treeAllReduceTime(nbytes, replicas, settings.link);
    } else if (settings.algorithm === "hierarchical") {
      var perBox = wholeNumber("replicas per box", settings.replicasPerBox, 1);
      if (replicas % perBox !== 0) {
        fail("replicas (" + replicas + ") must be a whole number of boxes of " + perBox +
             " replicas; pass a multiple of " + perBox + ".");
      }
      communication = hierarchicalAllReduceTime(nbytes, perBox, replicas / perBox,
                                                settings.inside, settings.link);
    } else if (settings.algorithm === "parameter server") {
      communication = parameterServerTime(nbytes, replicas, settings.servers, settings.link);
    } else {
      fail("algorithm must be ring, tree, hierarchical or parameter server, got " +
           settings.algorithm + ".");
    }
    var overlap = settings.overlap ? 1.0 : 0.0;
    var compute = settings.batch * settings.secondsPerExample;
    var step = stepTime(compute, communication, overlap);
    return {
      nbytes: nbytes, compute: compute, communication: communication, step: step,
      efficiency: scalingEfficiency(compute, step),
      smallestBatch: smallestBatchForEfficiency(settings.secondsPerExample, communication,
                                                settings.target, overlap),
    };
  }

  window.pargrad.cost = {
    link: link, ringPattern: ringPattern, treePattern: treePattern,
    parameterServerPattern: parameterServerPattern, messageTime: messageTime,
    ringAllReduceTime: ringAllReduceTime, treeAllReduceTime: treeAllReduceTime,
    hierarchicalAllReduceTime: hierarchicalAllReduceTime,
    parameterServerTime: parameterServerTime, stepTime: stepTime,
    scalingEfficiency: scalingEfficiency, smallestBatchForEfficiency: smallestBatchForEfficiency,
    LINKS: LINKS, dataParallelStep: dataParallelStep,
  };

  // ------------------------------------------------------------------- the form
  function linkOptions(selected) {
    return LINKS.map(function (each) {
      return '<option value="' + each.name + '"' + (each.name === selected ? " selected" : "") +
        ">" + each.name + " (α " + (each.latency * 1e6) + " µs, β " +
        (each.bandwidth / GB).toFixed(2) + " GB/s)</option>";
    }).join("") + '<option value="by hand">α and β by hand</option>';
  }

  var FORM =
    '<fieldset><legend>Model and batch</legend>' +
    '<label>parameters <input name="parameters" type="number" min="1" step="any" value="25600000"></label>' +
    '<label>bytes a parameter <select name="bytes"><option value="4" selected>4 (fp32)</option>' +
    '<option value="2">2 (fp16, bf16)</option><option value="1">1 (int8, fp8)</option></select></label>' +
    '<label>compute an example (ms) <input name="compute" type="number" min="0" step="any" value="0.4872"></label>' +
    '<label>batch a replica <input name="batch" type="number" min="1" step="1" value="64"></label>' +
    '</fieldset>' +
    '<fieldset><legend>Cluster</legend>' +
    '<label>replicas <input name="replicas" type="number" min="1" step="1" value="64"></label>' +
    '<label>algorithm <select name="algorithm"><option value="ring">ring all-reduce</option>' +
    '<option value="tree">tree all-reduce</option>' +
    '<option value="hierarchical" selected>hierarchical: ring inside boxes, ring across</option>' +
    '<option value="parameter server">parameter servers</option></select></label>' +
    '<label>link <select name="link">' + linkOptions("100 GbE") + '</select></label>' +
    '<label>ports (links side by side) <input name="ports" type="number" min="1" step="1" value="1"></label>' +
    '<label class="pc-by-hand">α (µs) <input name="alpha" type="number" min="0" step="any" value="5"></label>' +
    '<label class="pc-by-hand">β (GB/s) <input name="beta" type="number" min="0" step="any" value="25"></label>' +
    '<label class="pc-hier">replicas a box <input name="perbox" type="number" min="1" step="1" value="8"></label>' +
    '<label class="pc-hier">link inside a box <select name="inside">' + linkOptions("NVLink A100").replace(
      '<option value="by hand">α and β by hand</option>', "") + '</select></label>' +
    '<label class="pc-ps">parameter servers <input name="servers" type="number" min="1" step="1" value="64"></label>' +
    '<label><input name="overlap" type="checkbox"> overlap communication with compute</label>' +
    '<label>efficiency to keep (%) <input name="target" type="number" min="1" max="99.9" step="any" value="90"></label>' +
    '</fieldset>';

  var NOTE = "As it opens: about the chapter's ResNet-50 with fp32 gradients on " +
    "eight boxes of eight A100s with one 100 GbE port a box, as in the section on buckets. " +
    "The links are the vendors' peak figures and the chapter's assumed latencies.";

  function formatSeconds(seconds) {
    if (seconds >= 1) return seconds.toFixed(3) + " s";
    if (seconds >= 1e-3) return (seconds * 1e3).toFixed(3) + " ms";
    return (seconds * 1e6).toFixed(2) + " µs";
  }

  function readSettings(form) {
    var value = function (name) { return form.elements[name].value; };
    var number = function (name) { return Number(value(name)); };
    var find = function (name) {
      return LINKS.filter(function (each) { return each.name === name; })[0];
    };
    var chosen = value("link") === "by hand"
      ? link(number("alpha") * 1e-6, number("beta") * GB, "by hand") : find(value("link"));
    var ports = wholeNumber("ports", number("ports"), 1);
    return {
      parameters: positive("parameters", number("parameters"), "parameters"),
      bytesPerParameter: number("bytes"),
      secondsPerExample: positive("compute an example", number("compute") * 1e-3, "milliseconds"),
      batch: wholeNumber("batch a replica", number("batch"), 1),
      replicas: number("replicas"),
      algorithm: value("algorithm"),
      link: link(chosen.latency, chosen.bandwidth * ports, ports + " x " + chosen.name),
      inside: find(value("inside")),
      replicasPerBox: number("perbox"),
      servers: number("servers"),
      overlap: form.elements.overlap.checked,
      target: number("target") / 100,
    };
  }

  function hidesSome(result) { return result.compute + result.communication > result.step; }

  function drawBars(svg, result) {
    var width = 420, height = 118, left = 104, right = 12;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    var longest = Math.max(result.compute + result.communication, 1e-30);
    var scale = (width - left - right) / longest;
    var hidden = result.compute + result.communication - result.step;
    var rows = [["compute", 0, result.compute, "pc-compute"],
                ["communication", result.compute - hidden, result.communication, "pc-comm"],
                ["step", 0, result.step, "pc-step"]];
    text(svg, 8, 12, hidesSome(result) ? "overlap: the communication starts under the compute" :
         "compute, then communication", {class: "pc-small"});
    rows.forEach(function (row, i) {
      var y = 22 + i * 30;
      text(svg, left - 6, y + 14, row[0], {"text-anchor": "end", class: "pc-small"});
      el("rect", {x: left + row[1] * scale, y: y, width: Math.max(row[2] * scale, 0.5), height: 18,
                  class: "pc-bar " + row[3]}, svg);
    });
  }

  function drawEfficiency(svg, settings, result) {
    var width = 420, height = 240, left = 50, right = 26, top = 26, bottom = 36;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    var lowest = 1, highest = Math.max(65536, 4 * Math.max(result.smallestBatch, settings.batch));
    var xOf = function (b) {
      return left + Math.log(b / lowest) / Math.log(highest / lowest) * (width - left - right);
    };
    var yOf = function (e) { return height - bottom - e * (height - top - bottom); };
    var overlap = settings.overlap ? 1.0 : 0.0;
    var points = [];
    for (var i = 0; i <= 160; i++) {
      var b = lowest * Math.pow(highest / lowest, i / 160);
      var compute = b * settings.secondsPerExample;
      var e = scalingEfficiency(compute, stepTime(compute, result.communication, overlap));
      points.push(xOf(b).toFixed(2) + "," + yOf(e).toFixed(2));
    }
    el("line", {x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, class: "pc-axis"}, svg);
    el("line", {x1: left, y1: top, x2: left, y2: height - bottom, class: "pc-axis"}, svg);
    [0, 0.5, 1].forEach(function (e) {
      text(svg, left - 4, yOf(e) + 4, (100 * e) + "%", {"text-anchor": "end", class: "pc-small"});
    });
    for (var p = 1; p <= highest; p *= 16) {
      text(svg, xOf(p), height - bottom + 14, String(p), {"text-anchor": "middle", class: "pc-small"});
    }
    text(svg, (left + width) / 2, height - 4, "batch a replica", {"text-anchor": "middle", class: "pc-small"});
    text(svg, left, top - 10, "efficiency; dashed: the target; dotted: the smallest batch",
         {class: "pc-small"});
    el("line", {x1: left, y1: yOf(settings.target), x2: width - right, y2: yOf(settings.target),
                class: "pc-target"}, svg);
    el("polyline", {points: points.join(" "), class: "pc-curve"}, svg);
    el("line", {x1: xOf(result.smallestBatch), y1: top, x2: xOf(result.smallestBatch),
                y2: height - bottom, class: "pc-smallest"}, svg);
    el("circle", {cx: xOf(settings.batch), cy: yOf(result.efficiency), r: 5, class: "pc-here"}, svg);
  }

  /* Which fields the form shows: the link's by hand, the algorithm's own. */
  function showFields(form, container) {
    var algorithm = form.elements.algorithm.value;
    container.dataset.algorithm = algorithm;
    container.querySelectorAll(".pc-by-hand").forEach(function (node) {
      node.hidden = form.elements.link.value !== "by hand";
    });
    container.querySelectorAll(".pc-hier").forEach(function (node) { node.hidden = algorithm !== "hierarchical"; });
    container.querySelectorAll(".pc-ps").forEach(function (node) { node.hidden = algorithm !== "parameter server"; });
  }

  function resultRows(settings, result) {
    return [
      ["gradient", "nbytes", (result.nbytes / 1e6).toFixed(2) + " MB"],
      ["compute a step", "compute", formatSeconds(result.compute)],
      ["communication a step", "communication", formatSeconds(result.communication)],
      ["step", "step", formatSeconds(result.step)],
      ["scaling efficiency", "efficiency", (100 * result.efficiency).toFixed(1) + " %"],
      ["smallest batch a replica for " + (100 * settings.target).toFixed(1) + " %", "smallest",
       result.smallestBatch],
    ];
  }

  function build(container) {
    widgets.calculator(container, {
      form: FORM, note: NOTE,
      figures: [{className: "pc-bars", label: "the step split into compute and communication"},
                {className: "pc-efficiency", label: "efficiency against the batch a replica"}],
      beforeRedraw: showFields,
      read: readSettings,
      compute: dataParallelStep,
      keys: ["compute", "communication", "step", "efficiency", "smallestBatch"],
      rows: resultRows,
      draw: function (svgs, settings, result) {
        drawBars(svgs[0], result);
        drawEfficiency(svgs[1], settings, result);
      },
    });
  }

  widgets.mount("pargrad-scaling-calculator", build);
})();
