// The MBN web console: models, jobs and each model's map, through the public HTTP API only.
//
// One page; the URL's hash picks the view (#/models, #/jobs, #/map/<model id>). The API key,
// when the service wants one, lives in sessionStorage (this tab only) and goes out as
// "Authorization: Bearer <key>". Until the API accepts a key nothing but the key prompt shows.
// Everything that comes from the API is put on the page as text, never as HTML.
"use strict";

(() => {
  const KEY_STORAGE = "mbn.apiKey";
  const JOB_POLL_MS = 1000;
  const PLACED_COLOR = "#ff00ff"; // placed rows; no map group gets this colour
  // Tableau 20 without its pinks, so placed rows stand out.
  const PALETTE = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22",
    "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#c7c7c7",
    "#dbdb8d", "#9edae5", "#393b79", "#637939",
  ];
  const MAX_GROUPS = PALETTE.length; // more groups than colours: one trace, a colour scale

  const $ = (selector) => document.querySelector(selector);
  const views = ["key", "models", "map", "jobs"];
  const state = {
    authRequired: false,
    jobsTimer: null,
    clockOffsetMs: 0, // server clock minus this browser's, from the Date header
    map: null, // {model, data} of the map on screen
  };

  // ------------------------------------------------------------------ helpers

  /** An element with attributes (on* names become listeners) and text or element children. */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else if (name === "className") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function setText(selector, text) {
    $(selector).textContent = text || "";
  }

  function formatNumber(value) {
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return value.toLocaleString("en");
    return Math.abs(value) >= 100 ? value.toFixed(1) : value.toPrecision(4);
  }

  function formatDuration(seconds) {
    if (!Number.isFinite(seconds) || seconds < 0) return "—";
    const s = Math.round(seconds);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }

  /** Milliseconds since the epoch of an API timestamp (naive ones are UTC). */
  function parseTime(text) {
    if (!text) return NaN;
    const zoned = /([zZ]|[+-]\d\d:?\d\d)$/.test(text) ? text : `${text}Z`;
    return Date.parse(zoned);
  }

  // ------------------------------------------------------------------ the API

  class ApiError extends Error {
    constructor(status, type, message) {
      super(message);
      this.status = status;
      this.type = type;
    }
  }

  /** Call the API; JSON answers come back parsed, errors as ApiError with the API's message. */
  async function api(path, { method = "GET", json, form } = {}) {
    const headers = { Accept: "application/json" };
    const key = sessionStorage.getItem(KEY_STORAGE);
    if (key) headers.Authorization = `Bearer ${key}`;
    let body;
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(json);
    } else if (form !== undefined) {
      body = form; // the browser writes the multipart boundary
    }
    let response;
    try {
      response = await fetch(path, { method, headers, body });
    } catch (error) {
      throw new ApiError(0, "network_error", `the service did not answer (${error.message})`);
    }
    const date = Date.parse(response.headers.get("date") || "");
    if (Number.isFinite(date)) state.clockOffsetMs = date - Date.now();
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const error = data && data.error ? data.error : {};
      const failure = new ApiError(
        response.status,
        error.type || "http_error",
        error.message || `${response.status} ${response.statusText}`,
      );
      if (response.status === 401) showKeyPrompt(failure.message);
      throw failure;
    }
    return data;
  }

  // ------------------------------------------------------------------ views and routing

  function show(view) {
    for (const name of views) $(`#${name}-view`).hidden = name !== view;
    $("#loading").hidden = true;
    $("#nav").hidden = view === "key";
    $("#forget-key").hidden = !state.authRequired;
    for (const link of document.querySelectorAll("#nav a[data-view]")) {
      link.classList.toggle("active", link.dataset.view === view);
    }
    if (view !== "jobs") stopJobPolling();
    if (view !== "models") stopRuntimePolling();
    document.body.dataset.view = view;
  }

  function showKeyPrompt(message) {
    sessionStorage.removeItem(KEY_STORAGE);
    stopJobPolling();
    show("key");
    setText("#key-error", message || "");
    $("#key-input").value = "";
    $("#key-input").focus();
  }

  async function route() {
    if (state.authRequired && !sessionStorage.getItem(KEY_STORAGE)) {
      showKeyPrompt("");
      return;
    }
    const hash = window.location.hash || "#/models";
    const map = hash.match(/^#\/map\/(.+)$/);
    try {
      if (map) await showMap(decodeURIComponent(map[1]));
      else if (hash.startsWith("#/jobs")) await showJobs();
      else await showModels();
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return; // the prompt is up
      throw error;
    }
  }

  // ------------------------------------------------------------------ models

  async function showModels() {
    setText("#models-error", "");
    let list;
    try {
      list = await api("/models");
    } catch (error) {
      show("models");
      if (error.status !== 401) setText("#models-error", error.message);
      throw error;
    }
    const manifests = await Promise.all(
      list.models.map((model) =>
        api(`/models/${encodeURIComponent(model.id)}`).catch(() => null),
      ),
    );
    const body = $("#models-table tbody");
    body.replaceChildren(
      ...list.models.map((model, i) => modelRow(model, manifests[i] || {}, list.models)),
    );
    $("#models-empty").hidden = list.models.length > 0;
    $("#models-table").hidden = list.models.length === 0;
    show("models");
    refreshRuntime();
  }

  function modelRow(model, manifest, models) {
    const training = manifest.training || {};
    const method = manifest.method || (manifest.hyperparameters && manifest.hyperparameters.method) || "mbn";
    const reports = ["fidelity", "quality", "input_scaling"]
      .filter((name) => manifest[name] && typeof manifest[name] === "object")
      .map((name) => reportDetails(name, manifest[name]));
    if (model.state !== "damaged") {
      reports.push(livePanel(model));
      const versions = (models || []).filter(
        (other) => other.name === model.name && other.id !== model.id && other.state !== "damaged",
      );
      if (versions.length) reports.push(versionsPanel(model, manifest, versions));
    }
    return el(
      "tr",
      { "data-model-id": model.id },
      el("td", {}, model.name, model.default ? el("span", { className: "badge" }, "default") : null),
      el("td", {}, el("code", {}, model.id)),
      el("td", {}, method),
      el("td", {}, `${model.input_dim} → ${model.output_dim}`),
      el("td", {}, training.n_samples === undefined ? "—" : formatNumber(training.n_samples)),
      el("td", { title: model.created }, model.created.replace("T", " ").replace("Z", " UTC")),
      el("td", {}, reports.length ? reports : "—"),
      el(
        "td",
        { className: "actions" },
        manifest.map ? el("a", { href: `#/map/${encodeURIComponent(model.id)}` }, "Map") : null,
        el("button", { type: "button", className: "danger", onclick: () => confirmDelete(model) }, "Delete"),
      ),
    );
  }

  // What each report says (mbn info and the guide say the same): the quality report's
  // neighbourhood scores favour PCA by construction, and read alone they looked like a loss.
  const REPORT_READS = {
    fidelity:
      "Rows new to the model. nmi_labels_exact / _fast (with labels): how well the embedding's " +
      "clusters match the classes, 1 = exactly: the figure to choose a model by. " +
      "cluster_agreement, r2, cosine: how closely the fast path follows the exact model; " +
      "where they are low, use exact mode.",
    quality:
      "Trustworthiness / continuity: whether rows near each other in the input stay near in " +
      "the embedding (1 = every neighbour kept). PCA with as many components is a projection " +
      "of the input, so it keeps input neighbourhoods by construction and usually scores " +
      "higher; MBN gives up detail inside clusters to pull clusters apart, so a lower score " +
      "beside PCA's is no loss when clusters are what you use.",
  };

  // What a layout method's report measured (mbn_core.pipeline.fidelity: LAYOUT_REPORT_MEANING).
  const LAYOUT_REPORTS = ["cross-fitted students", "held out of the student"];
  const LAYOUT_MEANING =
    "The method laid out every training row and has no map of its own that a new row could be " +
    "compared with, so each measured row was placed by a student network that never saw it and " +
    "compared with where the method put it (exact = the method's layout of those rows, fast = " +
    "the student): the fidelity a new row gets from the fast path.";

  function reportDetails(name, report) {
    const reads = REPORT_READS[name];
    const meaning =
      name === "fidelity" && LAYOUT_REPORTS.includes(report.holdout)
        ? el("p", { className: "report-meaning" }, LAYOUT_MEANING)
        : null;
    const rows = Object.entries(report).map(([key, value]) =>
      el(
        "tr",
        {},
        el("th", {}, key),
        el("td", {}, value !== null && typeof value === "object" ? JSON.stringify(value) : formatNumber(value)),
      ),
    );
    return el(
      "details",
      { className: `report report-${name}` },
      el("summary", {}, name),
      meaning,
      reads ? el("p", { className: "report-reads" }, reads) : null,
      el("table", {}, el("tbody", {}, rows)),
    );
  }

  function num(value) {
    return value === null || value === undefined ? "—" : formatNumber(value);
  }

  // The live monitor of this replica, fetched when opened (it may run a k-means).
  function livePanel(model) {
    const body = el("div", {}, "…");
    const details = el(
      "details",
      { className: "report report-live" },
      el("summary", {}, "live"),
      body,
    );
    details.addEventListener("toggle", async () => {
      if (!details.open) return;
      try {
        const monitor = await api(`/models/${encodeURIComponent(model.id)}/monitor`);
        const live = monitor.live || {};
        // A method with no exact map (densMAP, TriMap) has nothing to compare the fast path
        // with: the panel says so instead of showing zeros.
        const liveOf = (key) => (live.state ? live.state : num(live[key]));
        const rows = [
          ["replica", monitor.replica],
          ["state", monitor.state],
          ["rows seen", monitor.rows_seen],
          ["shadow rows (window)", `${monitor.shadow_rows} (${monitor.window_shadow_rows})`],
          ["waiting for a batch", monitor.pending_rows],
          ["R² live / training", `${liveOf("r2")} / ${num((monitor.training || {}).r2)}`],
          [
            "median cosine live / training",
            `${liveOf("cosine_median")} / ${num((monitor.training || {}).cosine_median)}`,
          ],
          [
            "cluster agreement live / training",
            `${liveOf("cluster_agreement")} / ${num((monitor.training || {}).cluster_agreement)}`,
          ],
          ["novel share", monitor.novelty_available ? num(monitor.novelty_share) : `— (${monitor.novelty_unavailable})`],
          ["out of range share", num(monitor.out_of_range_share)],
          ["out of range, not shadowed", monitor.skipped_out_of_range],
          ["last update", monitor.last_update || "—"],
          ["note", monitor.note],
        ];
        body.replaceChildren(
          el("table", {}, el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v)))))),
        );
      } catch (error) {
        body.replaceChildren(el("p", { className: "error" }, error.message));
      }
    });
    return details;
  }

  // The exact runtime of this replica: state, device, queue, steps and their times, fetched
  // every two seconds while its panel is open and the models are shown.
  const RUNTIME_REFRESH_MS = 2000;
  let runtimeTimer = null;

  function stopRuntimePolling() {
    if (runtimeTimer !== null) clearTimeout(runtimeTimer);
    runtimeTimer = null;
  }

  function histogramText(histogram, unit, scale = 1) {
    if (!histogram) return "—";
    const bounds = histogram.bounds.map((b) => `≤${formatNumber(b * scale)}${unit}`);
    return histogram.counts
      .map((count, i) => (count ? `${bounds[i] || `>${formatNumber(histogram.bounds.at(-1) * scale)}${unit}`}: ${count}` : null))
      .filter(Boolean)
      .join(", ") || "—";
  }

  async function refreshRuntime() {
    stopRuntimePolling();
    const panel = $("#runtime-panel");
    if (!panel.open || document.body.dataset.view !== "models") return;
    try {
      const r = await api("/exact/runtime");
      const ms = (value) => (value === null ? "—" : `${formatNumber(value)} ms`);
      const rows = [
        ["state", r.description],
        ["device", r.device ? r.device + (r.device_note ? ` (${r.device_note})` : "") : "—"],
        ["restarts", r.restarts],
        ["queued requests / rows", `${r.queued_requests} / ${r.queued_rows}`],
        ["rows computing now", r.running_rows],
        ["models held", `${r.models_loaded} (${formatNumber(r.model_bytes / 1048576)} MiB)`],
        ["requests / rows answered", `${r.requests} / ${r.rows}`],
        ["steps, mean rows per step", `${r.batches}, ${num(r.mean_batch_rows)}`],
        ["rows per step", histogramText(r.batch_rows, "")],
        ["mean wait / compute", `${ms(r.mean_wait_ms)} / ${ms(r.mean_compute_ms)}`],
        ["wait before the first step", histogramText(r.wait_seconds, " ms", 1000)],
        ["compute time of a step", histogramText(r.compute_seconds, " ms", 1000)],
        ["cancelled / timed out / refused", `${r.cancelled} / ${r.timed_out} / ${r.rejected}`],
        ["steps abandoned (nobody waited)", r.abandoned],
      ];
      $("#runtime-body").replaceChildren(
        el("table", {}, el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v)))))),
      );
      panel.dataset.state = r.state;
    } catch (error) {
      if (error.status === 401) return;
      $("#runtime-body").replaceChildren(el("p", { className: "error" }, error.message));
    }
    runtimeTimer = setTimeout(refreshRuntime, RUNTIME_REFRESH_MS);
  }

  // Other versions of the name, compared with this one on reference rows when opened.
  function versionsPanel(model, manifest, versions) {
    const alignment = manifest.alignment;
    const body = el("div", {}, "…");
    const details = el(
      "details",
      { className: "report report-versions" },
      el("summary", {}, `versions (${versions.length + 1})`),
      alignment
        ? el("p", {}, `aligned to ${alignment.reference_model}, residual ${num(alignment.residual)}`)
        : null,
      body,
    );
    details.addEventListener("toggle", async () => {
      if (!details.open) return;
      const rows = await Promise.all(
        versions.map(async (other) => {
          try {
            const report = await api(
              `/models/${encodeURIComponent(model.id)}/compare/${encodeURIComponent(other.id)}`,
            );
            const fast = report.fast;
            return el(
              "tr",
              {},
              el("th", {}, other.id),
              el("td", {}, `cosine ${num(fast.cosine_median)}`),
              el("td", {}, `10-NN ${num(fast.knn_overlap)}`),
              el("td", {}, `clusters ${num(fast.cluster_agreement)}`),
            );
          } catch (error) {
            return el("tr", {}, el("th", {}, other.id), el("td", { colSpan: 3 }, error.message));
          }
        }),
      );
      body.replaceChildren(el("table", {}, el("tbody", {}, rows)));
    });
    return details;
  }

  function confirmDelete(model) {
    const dialog = $("#delete-dialog");
    setText("#delete-name", model.name);
    setText("#delete-id", model.id);
    dialog.returnValue = "";
    dialog.onclose = async () => {
      if (dialog.returnValue !== "delete") return;
      try {
        await api(`/models/${encodeURIComponent(model.id)}`, { method: "DELETE" });
      } catch (error) {
        setText("#models-error", error.message);
        return;
      }
      await showModels();
    };
    dialog.showModal();
  }

  // ------------------------------------------------------------------ the map

  async function showMap(modelId) {
    setText("#map-error", "");
    setText("#embed-error", "");
    setText("#embed-result", "");
    setText("#map-title", modelId);
    setText("#map-caption", "");
    show("map");
    let data;
    try {
      data = await api(`/models/${encodeURIComponent(modelId)}/map`);
    } catch (error) {
      if (error.status !== 401) setText("#map-error", error.message);
      Plotly.purge($("#map-plot"));
      throw error;
    }
    setText("#map-title", data.name);
    const of = data.n_samples ? ` of ${formatNumber(data.n_samples)}` : "";
    const colour = data.color_by ? `, coloured by ${data.color_by}` : "";
    setText(
      "#map-caption",
      `t-SNE of ${formatNumber(data.n_points)} training rows${of}${colour}. ` +
        "Drag to zoom, double-click to reset, scroll to zoom, hold shift to pan.",
    );
    state.map = { model: data.model, data };
    await drawMap(data);
  }

  function mapTraces(data) {
    const custom = data.x.map((_, i) => [
      data.row[i],
      data.cluster ? data.cluster[i] : "—",
      data.label ? data.label[i] : "—",
    ]);
    const hovertemplate =
      "row %{customdata[0]}<br>cluster %{customdata[1]}<br>label %{customdata[2]}" +
      "<br>(%{x:.2f}, %{y:.2f})<extra></extra>";
    const groups = data.color_by === "label" ? data.label : data.cluster;
    const base = { type: "scattergl", mode: "markers", hovertemplate };
    if (!groups) {
      return [{ ...base, name: "training rows", x: data.x, y: data.y, customdata: custom,
        marker: { size: 4, color: PALETTE[0], opacity: 0.7 } }];
    }
    const names = [...new Set(groups.map(String))].sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
    if (names.length > MAX_GROUPS) {
      const codes = groups.map((g) => names.indexOf(String(g)));
      return [{ ...base, name: data.color_by, x: data.x, y: data.y, customdata: custom,
        marker: { size: 4, color: codes, colorscale: "Turbo", opacity: 0.7 } }];
    }
    const members = new Map(names.map((name) => [name, []]));
    groups.forEach((g, i) => members.get(String(g)).push(i));
    return names.map((name, n) => {
      const idx = members.get(name);
      return { ...base, name: `${data.color_by} ${name}`,
        x: idx.map((i) => data.x[i]), y: idx.map((i) => data.y[i]),
        customdata: idx.map((i) => custom[i]),
        marker: { size: 4, color: PALETTE[n], opacity: 0.7 } };
    });
  }

  async function drawMap(data) {
    const traces = mapTraces(data);
    const layout = {
      // Room above the plot for Plotly's toolbar: the legend starts below it, not under it.
      margin: { l: 10, r: 10, t: 40, b: 10 },
      dragmode: "zoom",
      hovermode: "closest",
      legend: { itemsizing: "constant", x: 1.02, xanchor: "left", y: 1, yanchor: "top" },
      xaxis: { showgrid: false, zeroline: false, showticklabels: false },
      yaxis: { showgrid: false, zeroline: false, showticklabels: false, scaleanchor: "x" },
      paper_bgcolor: "#ffffff",
      plot_bgcolor: "#ffffff",
    };
    const config = { responsive: true, scrollZoom: true, displaylogo: false };
    const started = performance.now();
    await Plotly.newPlot($("#map-plot"), traces, layout, config);
    // Drawn once the browser has painted the frame Plotly rendered into.
    await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
    const ms = performance.now() - started;
    document.body.dataset.mapPoints = String(data.n_points);
    document.body.dataset.mapRenderMs = ms.toFixed(1);
  }

  // ------------------------------------------------------------------ rows for the embed box

  function parseText(text) {
    const trimmed = text.trim();
    if (!trimmed) throw new Error("paste rows or choose a file first");
    if (trimmed[0] === "[" || trimmed[0] === "{") {
      let value;
      try {
        value = JSON.parse(trimmed);
      } catch (error) {
        throw new Error(`not valid JSON: ${error.message}`);
      }
      if (value && !Array.isArray(value)) value = value.inputs || value.data;
      if (!Array.isArray(value)) throw new Error('JSON must be a list of rows or {"inputs": [...]}');
      return value.length && typeof value[0] === "number" ? [value] : value;
    }
    return parseCsv(trimmed);
  }

  function parseCsv(text) {
    const rows = text.split(/\r?\n/).filter((line) => line.trim()).map((line) => line.split(",").map((c) => c.trim()));
    const numeric = (cell) => cell !== "" && Number.isFinite(Number(cell));
    // A header has no number in it; a first row with one bad cell is reported, not dropped.
    if (!rows[0].some(numeric)) rows.shift();
    if (!rows.length) throw new Error("CSV has no data rows");
    return rows.map((row, r) =>
      row.map((cell, c) => {
        if (!numeric(cell)) throw new Error(`CSV row ${r + 1}, column ${c + 1}: ${JSON.stringify(cell)} is not a number`);
        return Number(cell);
      }),
    );
  }

  const NPY_TYPES = {
    f4: Float32Array, f8: Float64Array, i1: Int8Array, u1: Uint8Array, i2: Int16Array,
    u2: Uint16Array, i4: Int32Array, u4: Uint32Array, i8: BigInt64Array, u8: BigUint64Array,
  };

  /** Rows of a NumPy .npy file (1-D: one row; 2-D: rows), little-endian numbers only. */
  function parseNpy(buffer) {
    const bytes = new Uint8Array(buffer);
    const magic = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
    if (bytes.length < 10 || !magic.every((b, i) => bytes[i] === b)) throw new Error("not a .npy file");
    const view = new DataView(buffer);
    const major = bytes[6];
    const headerLength = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
    const start = major === 1 ? 10 : 12;
    const header = new TextDecoder("latin1").decode(bytes.subarray(start, start + headerLength));
    const descr = (header.match(/'descr':\s*'([^']+)'/) || [])[1];
    const fortran = /'fortran_order':\s*True/.test(header);
    const shapeText = (header.match(/'shape':\s*\(([^)]*)\)/) || [])[1];
    if (!descr || shapeText === undefined) throw new Error(".npy header unreadable");
    const match = descr.match(/^([<|=])([fiu]\d)$/);
    if (!match || !NPY_TYPES[match[2]]) throw new Error(`.npy dtype ${descr} not supported (little-endian numbers only)`);
    const shape = shapeText.split(",").map((s) => s.trim()).filter(Boolean).map(Number);
    if (shape.length < 1 || shape.length > 2) throw new Error(`.npy must be 1-D or 2-D, got shape (${shapeText})`);
    const [n, d] = shape.length === 1 ? [1, shape[0]] : shape;
    const Type = NPY_TYPES[match[2]];
    const dataStart = start + headerLength;
    // A copy: typed arrays need an offset aligned to their element size.
    const values = new Type(buffer.slice(dataStart, dataStart + n * d * Type.BYTES_PER_ELEMENT));
    if (values.length !== n * d) throw new Error(".npy file is truncated");
    const rows = [];
    for (let r = 0; r < n; r++) {
      const row = new Array(d);
      for (let c = 0; c < d; c++) row[c] = Number(values[fortran ? c * n + r : r * d + c]);
      rows.push(row);
    }
    return rows;
  }

  async function rowsFromForm() {
    const file = $("#embed-file").files[0];
    if (file) {
      if (file.name.toLowerCase().endsWith(".npy")) return parseNpy(await file.arrayBuffer());
      return parseText(await file.text());
    }
    return parseText($("#embed-text").value);
  }

  async function placeRows(event) {
    event.preventDefault();
    setText("#embed-error", "");
    setText("#embed-result", "");
    if (!state.map) return;
    const { model } = state.map;
    let rows;
    try {
      rows = await rowsFromForm();
    } catch (error) {
      setText("#embed-error", error.message);
      return;
    }
    const mode = $("#embed-mode").value;
    try {
      const embedded = await api("/embed", { method: "POST", json: { model, inputs: rows, mode } });
      const placed = await api(`/models/${encodeURIComponent(model)}/map/locate`, {
        method: "POST",
        json: { embeddings: embedded.embeddings },
      });
      await drawPlaced(embedded, placed, mode);
    } catch (error) {
      if (error.status !== 401) setText("#embed-error", error.message);
    }
  }

  async function drawPlaced(embedded, placed, mode) {
    const plot = $("#map-plot");
    const existing = plot.data.findIndex((trace) => trace.meta === "placed");
    if (existing >= 0) await Plotly.deleteTraces(plot, existing);
    const custom = placed.x.map((_, i) => [i + 1, embedded.clusters ? embedded.clusters[i] : "—"]);
    await Plotly.addTraces(plot, {
      type: "scattergl",
      mode: "markers",
      meta: "placed",
      name: `your rows (${mode})`,
      x: placed.x,
      y: placed.y,
      customdata: custom,
      hovertemplate: "your row %{customdata[0]}<br>cluster %{customdata[1]}<extra></extra>",
      marker: { size: 14, symbol: "x", color: PLACED_COLOR, line: { width: 1, color: "#000000" } },
    });
    const first = `row 1 at (${placed.x[0].toFixed(2)}, ${placed.y[0].toFixed(2)})` +
      (embedded.clusters ? `, cluster ${embedded.clusters[0]}` : "");
    setText("#embed-result", `${placed.x.length} row(s) placed (${mode} mode): ${first}.`);
    document.body.dataset.placedRows = String(placed.x.length);
  }

  // ------------------------------------------------------------------ jobs

  async function showJobs() {
    show("jobs");
    await refreshJobs();
    stopJobPolling();
    state.jobsTimer = setInterval(() => refreshJobs().catch(() => {}), JOB_POLL_MS);
  }

  function stopJobPolling() {
    if (state.jobsTimer !== null) clearInterval(state.jobsTimer);
    state.jobsTimer = null;
  }

  async function refreshJobs() {
    let list;
    try {
      list = await api("/jobs");
    } catch (error) {
      if (error.status !== 401) setText("#jobs-error", error.message);
      throw error;
    }
    setText("#jobs-error", "");
    // A job's Map link only while its model is there (a deleted model's map is empty).
    const models = await api("/models").catch(() => null);
    const present = models ? new Set(models.models.map((model) => model.id)) : null;
    const now = Date.now() + state.clockOffsetMs;
    $("#jobs-table tbody").replaceChildren(...list.jobs.map((job) => jobRow(job, now, present)));
    $("#jobs-empty").hidden = list.jobs.length > 0;
    $("#jobs-table").hidden = list.jobs.length === 0;
  }

  function jobRow(job, now, present) {
    const started = parseTime(job.started_at);
    const finished = parseTime(job.finished_at);
    const elapsed = Number.isFinite(started) ? ((Number.isFinite(finished) ? finished : now) - started) / 1000 : NaN;
    let remaining = NaN;
    if (job.status === "running" && job.progress > 0.01) remaining = (elapsed * (1 - job.progress)) / job.progress;
    if (job.status === "succeeded") remaining = 0;
    const percent = Math.round(job.progress * 100);
    const active = job.status === "queued" || job.status === "running";
    let note = null;
    if (job.status === "failed" && job.error) note = el("div", { className: "error" }, job.error);
    return el(
      "tr",
      { "data-job-id": job.id, "data-status": job.status },
      el("td", {}, job.name, el("div", { className: "muted" }, el("code", {}, job.id.slice(0, 8))), note),
      el("td", {}, el("span", { className: `status status-${job.status}` }, job.status)),
      el(
        "td",
        {},
        el("progress", { max: 100, value: percent, "aria-label": `${job.name} progress` }),
        el("span", { className: "percent" }, `${percent}%`),
      ),
      el("td", {}, job.phase || "—"),
      el("td", {}, formatDuration(elapsed)),
      el("td", {}, formatDuration(remaining)),
      el(
        "td",
        { className: "actions" },
        active ? el("button", { type: "button", onclick: () => cancelJob(job.id) }, "Cancel") : null,
        jobModelLink(job, present),
      ),
    );
  }

  function jobModelLink(job, present) {
    if (!job.model_id) return null;
    if (present && !present.has(job.model_id)) {
      return el("span", { className: "muted", "data-model-deleted": "" }, "model deleted");
    }
    return el("a", { href: `#/map/${encodeURIComponent(job.model_id)}` }, "Map");
  }

  async function cancelJob(jobId) {
    try {
      await api(`/jobs/${encodeURIComponent(jobId)}/cancel`, { method: "POST" });
    } catch (error) {
      if (error.status !== 401) setText("#jobs-error", error.message);
      return;
    }
    await refreshJobs();
  }

  /** The params object from the form's fields and its JSON box; Error naming a bad field. */
  function trainParams() {
    let params = {};
    const extra = $("#train-extra").value.trim();
    if (extra) {
      try {
        params = JSON.parse(extra);
      } catch (error) {
        throw Object.assign(new Error(`other parameters: not valid JSON (${error.message})`), { field: $("#train-extra") });
      }
      if (!params || typeof params !== "object" || Array.isArray(params)) {
        throw Object.assign(new Error("other parameters: must be a JSON object"), { field: $("#train-extra") });
      }
    }
    for (const input of document.querySelectorAll("#train-form [data-param]")) {
      const raw = input.value.trim();
      if (!raw) continue;
      const kind = input.dataset.kind;
      if (kind === "text") params[input.dataset.param] = raw;
      else if (kind === "list") params[input.dataset.param] = raw.split(/[\s,]+/).filter(Boolean).map(Number);
      else params[input.dataset.param] = Number(raw);
    }
    return params;
  }

  function clearFieldErrors() {
    for (const node of document.querySelectorAll("#train-form .field-error")) node.remove();
    for (const node of document.querySelectorAll("#train-form .invalid")) node.classList.remove("invalid");
    setText("#train-error", "");
  }

  /** Show a message in the form, and beside the field it names (the API names its keys). */
  function showTrainError(message, field) {
    setText("#train-error", message);
    let target = field;
    if (!target) {
      for (const input of document.querySelectorAll("#train-form [data-param]")) {
        if (new RegExp(`\\b${input.dataset.param}\\b`).test(message)) target = input;
      }
      if (/\b(file|data)\b/.test(message)) target = target || $("#train-file");
      if (/\bname\b/.test(message)) target = target || $("#train-name");
    }
    if (target) {
      target.classList.add("invalid");
      target.closest("label").append(el("span", { className: "field-error", role: "alert" }, message));
    }
  }

  async function submitTraining(event) {
    event.preventDefault();
    clearFieldErrors();
    setText("#train-result", "");
    const file = $("#train-file").files[0];
    if (!file) {
      showTrainError("choose a data file (.npy, .npz or .csv)", $("#train-file"));
      return;
    }
    let params;
    try {
      params = trainParams();
    } catch (error) {
      showTrainError(error.message, error.field);
      return;
    }
    const form = new FormData();
    form.append("file", file, file.name);
    form.append("name", $("#train-name").value.trim() || "model");
    form.append("params", JSON.stringify(params));
    $("#train-submit").disabled = true;
    try {
      const job = await api("/train", { method: "POST", form });
      setText("#train-result", `Job ${job.id} ${job.status}.`);
      await refreshJobs();
    } catch (error) {
      if (error.status !== 401) showTrainError(error.message);
    } finally {
      $("#train-submit").disabled = false;
    }
  }

  // ------------------------------------------------------------------ start

  async function signIn(event) {
    event.preventDefault();
    const key = $("#key-input").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY_STORAGE, key);
    setText("#key-error", "");
    try {
      await api("/models"); // a 401 puts the prompt back, with the API's message
    } catch {
      return;
    }
    await route();
  }

  async function start() {
    $("#key-form").addEventListener("submit", signIn);
    $("#embed-form").addEventListener("submit", placeRows);
    $("#train-form").addEventListener("submit", submitTraining);
    $("#forget-key").addEventListener("click", () => showKeyPrompt(""));
    $("#embed-file").addEventListener("change", () => setText("#embed-error", ""));
    $("#runtime-panel").addEventListener("toggle", () => refreshRuntime());
    window.addEventListener("hashchange", () => route().catch(() => {}));
    const config = await fetch("/ui/config.json").then((response) => response.json());
    state.authRequired = Boolean(config.auth_required);
    await route().catch(() => {});
  }

  start();
})();
