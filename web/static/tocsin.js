// Small behaviours of the Tocsin UI: copy buttons, and the operators' live charts (uPlot, vendored).
"use strict";

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const text = document.querySelector(button.dataset.copy)?.textContent ?? "";
  navigator.clipboard?.writeText(text).then(() => { button.textContent = "Copied"; });
});

(function dashboard() {
  const charts = document.getElementById("charts");
  if (!charts || typeof uPlot === "undefined") return;
  const sampleS = Number(document.getElementById("tiles").dataset.sampleS) || 2;
  // [field, label, colour, more uPlot series options]: the evaluated line is dashed in another colour, so the input
  // line it usually lies on shows through its gaps.
  const series = {
    rates: [["input_rate", "input", "#2f5bd3", { width: 3 }], ["evaluated_rate", "evaluated", "#ea580c", { dash: [6, 4] }]],
    batch: [["batch_ms", "batch ms", "#7c3aed"]],
    lag: [["lag", "lag", "#b45309"]],
    selectivity: [["candidate_rate", "candidates", "#0891b2"], ["match_rate", "matches", "#be185d"]],
    queue: [["queued", "queued", "#2f5bd3"], ["unacked", "held by workers", "#6b7280"]],
    delivery: [["success_pct", "success %", "#15803d"]],
  };
  // A share is 0–100 %, whatever the samples (uPlot pads a flat line at 100 up to 200).
  const percentScale = { y: { range: [0, 100] } };
  const scales = { delivery: percentScale };
  const plots = {};
  window.tocsinCharts = plots; // the uPlot instances, for a look from the console (and the UI tests)

  // The y axis as wide as its longest label (a fixed width cut "2,000,000" short), and at least 60 px: the time
  // axis's date line ("11/27/26 11:19pm") sits centred under its first tick and needs that room on the left.
  // uPlot asks again per layout cycle.
  const MIN_AXIS_PX = 60;
  function axisSize(self, values, axisIdx, cycleNum) {
    const axis = self.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    let size = axis.ticks.size + axis.gap;
    const longest = (values ?? []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
    if (longest) {
      self.ctx.font = axis.font[0];
      size += self.ctx.measureText(longest).width / devicePixelRatio;
    }
    return Math.max(Math.ceil(size) + 4, MIN_AXIS_PX);
  }

  function columns(samples, fields) {
    const t = samples.map((s) => s.t);
    return [t, ...fields.map(([name]) => samples.map((s) => (s[name] ?? null)))];
  }

  function draw(samples) {
    for (const s of samples) s.success_pct = s.success_rate == null ? null : 100 * s.success_rate;
    for (const [name, fields] of Object.entries(series)) {
      const figure = charts.querySelector(`[data-chart="${name}"]`);
      const data = columns(samples, fields);
      if (!plots[name]) {
        plots[name] = new uPlot({
          width: figure.clientWidth - 16, height: 170,
          scales: { x: { time: true }, ...(scales[name] ?? {}) },
          series: [{}, ...fields.map(([, label, stroke, more]) => ({ label, stroke, width: 2, spanGaps: true, ...more }))],
          axes: [{}, { size: axisSize }],
        }, data, figure);
      } else {
        plots[name].setData(data);
      }
    }
    const latest = samples[samples.length - 1];
    for (const cell of document.querySelectorAll("#tiles [data-metric]")) {
      // data-last-known: the newest value the chart shows; a period with nothing to measure (no delivery attempted)
      // has none, and the chart draws across it
      const metric = cell.dataset.metric;
      let value = "lastKnown" in cell.dataset ? samples.findLast((s) => s[metric] != null)?.[metric] : latest[metric];
      if (value == null) { cell.textContent = "–"; continue; }
      if ("percent" in cell.dataset) value *= 100;
      cell.textContent = Math.abs(value) >= 100 ? Math.round(value).toLocaleString() : Number(value.toFixed(1)).toString();
    }
    const status = document.getElementById("sample-status");
    status.textContent = `${samples.length} samples · Kafka ${latest.kafka} · last micro-batch #${latest.batch_id}`;
  }

  async function refresh() {
    try {
      const response = await fetch("/ops/samples", { headers: { Accept: "application/json" } });
      if (response.ok) {
        const samples = await response.json();
        if (samples.length) draw(samples);
      }
    } finally {
      setTimeout(refresh, sampleS * 1000);
    }
  }
  refresh();
})();

// A rate-limited fragment (429) carries its message: show it in place, as a 200 would be.
document.addEventListener("htmx:beforeSwap", (event) => {
  if (event.detail.xhr.status === 429) {
    event.detail.shouldSwap = true;
    event.detail.isError = false;
  }
});

// The subscription form: the selected stream's attributes, dimensions and examples are the ones shown; a click
// on one inserts it into the condition at the cursor (and the condition is checked again, as when typed).
(function streamFields() {
  const select = document.getElementById("stream");
  const condition = document.getElementById("condition");
  if (!select || !condition) return;

  function show() {
    for (const block of document.querySelectorAll("[data-stream-fields]")) {
      const shown = block.dataset.streamFields === select.value;
      block.hidden = !shown;
      if (shown) condition.placeholder = block.dataset.example;
    }
  }

  function insert(text, whole) {
    if (whole) {
      condition.value = text;
    } else {
      const start = condition.selectionStart ?? condition.value.length;
      const end = condition.selectionEnd ?? start;
      condition.value = condition.value.slice(0, start) + text + condition.value.slice(end);
      condition.setSelectionRange(start + text.length, start + text.length);
    }
    condition.focus();
    condition.dispatchEvent(new Event("input", { bubbles: true }));
  }

  select.addEventListener("change", show);
  document.getElementById("stream-fields").addEventListener("click", (event) => {
    const chip = event.target.closest("[data-insert]");
    const example = event.target.closest("[data-insert-condition]");
    if (chip) insert(chip.dataset.insert, false);
    else if (example) insert(example.dataset.insertCondition, true);
  });
  show();
})();

// A finished backtest's chart (web/templates/_backtest.html): per key, its value at each chunk's last boundary, the
// condition's thresholds as flat lines, and the firings (red) and resolutions (green) at the values they carried.
function drawBacktest(root) {
  if (typeof uPlot === "undefined") return;
  root.querySelectorAll(".backtest-chart:not([data-drawn])").forEach((box) => {
    box.dataset.drawn = "1";
    const chart = JSON.parse(box.dataset.chart);
    window.tocsinBacktestPlots = [];
    for (const series of chart.keys) {
      const times = series.points.map((p) => p[0] / 1000);
      const marks = new Map(series.marks.map((m) => [m[0] / 1000, m]));
      for (const t of marks.keys()) if (!times.includes(t)) times.push(t);
      times.sort((a, b) => a - b);
      const value = new Map(series.points.map((p) => [p[0] / 1000, p[1]]));
      const columns = [times, times.map((t) => (value.has(t) ? value.get(t) : null))];
      const lines = [{}, {label: series.key, stroke: "#1f6feb", spanGaps: true}];
      chart.thresholds.forEach((x, i) => {
        columns.push(times.map(() => x));
        lines.push({label: `threshold ${i + 1}`, stroke: "#888", dash: [4, 4], points: {show: false}});
      });
      for (const [state, colour] of [["firing", "#d1242f"], ["resolved", "#1a7f37"]]) {
        columns.push(times.map((t) => {
          const m = marks.get(t);
          return m && m[1] === state ? (m[2] ?? value.get(t) ?? null) : null;
        }));
        lines.push({label: state, stroke: colour, width: 0, points: {show: true, size: 8, fill: colour}});
      }
      const title = document.createElement("h4");
      title.textContent = series.key;
      box.appendChild(title);
      window.tocsinBacktestPlots.push(new uPlot({width: Math.min(box.clientWidth || 720, 900), height: 220, series: lines},
                                                columns, box));
    }
  });
}
document.addEventListener("htmx:afterSwap", (event) => drawBacktest(event.target.parentNode || document));
