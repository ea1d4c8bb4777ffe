// Floodgate's dashboard: plain JavaScript, no framework. The server pushes
// a snapshot every few seconds on /dashboard/events (server-sent events);
// the key inspector and the overrides editor call the admin API through
// /dashboard/api/, authenticated by the session cookie.
"use strict";
(function () {
  const WINDOW = 600; // seconds of history kept, as the server
  const COLORS = { allowed: "#2e8b57", refused: "#c0392b", shadow_refused: "#7d3c98", degraded: "#566573", warned: "#d68910" };
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }

  // api calls the admin API's path through the dashboard, and resolves to
  // {status, ok, body} (body: the parsed JSON, or the text).
  async function api(path, opts) {
    opts = opts || {};
    const init = { method: opts.method || "GET", credentials: "same-origin", headers: { "X-Floodgate-Dashboard": "1" } };
    if (opts.body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = typeof opts.body === "string" ? opts.body : JSON.stringify(opts.body);
    }
    const resp = await fetch("api" + path, init);
    const text = await resp.text();
    let body = text;
    try { body = text ? JSON.parse(text) : null; } catch (e) { /* not JSON */ }
    if (resp.status === 401) sessionLost();
    return { status: resp.status, ok: resp.ok, body: body };
  }

  function errorText(r) {
    if (r.body && typeof r.body === "object" && r.body.error) return r.body.error;
    return "HTTP " + r.status + (typeof r.body === "string" && r.body ? ": " + r.body.trim() : "");
  }

  function sessionLost() { location.reload(); } // the server answers with the login form

  // --- decisions per rule -------------------------------------------------
  const rules = new Map(); // "domain\u0000rule" → {domain, rule, t: [], c: [[]...], total, plot, box}
  let outcomes = ["allowed", "refused", "shadow_refused", "degraded", "warned"];
  let lastTime = 0;

  function ruleKey(d, r) { return d + "\u0000" + r; }
  function ruleLabel(d, r) { return d ? d + " / " + r : r; } // a proxy's route may have no domain

  function applySeries(snap) {
    outcomes = snap.outcomes || outcomes;
    for (const s of snap.series) {
      const k = ruleKey(s.domain, s.rule);
      let r = rules.get(k);
      if (!r) {
        r = { domain: s.domain, rule: s.rule, t: [], c: outcomes.map(() => []), total: s.total };
        rules.set(k, r);
      }
      r.total = s.total;
      // drop what the new points cover, then append them
      while (r.t.length && r.t[r.t.length - 1] >= s.start) { r.t.pop(); r.c.forEach((a) => a.pop()); }
      padTo(r, s.start - 1);
      s.counts.forEach((row, i) => {
        r.t.push(s.start + i);
        row.forEach((v, j) => r.c[j].push(v));
      });
    }
    if (snap.time) {
      lastTime = snap.time;
      for (const r of rules.values()) padTo(r, snap.time);
    }
    for (const r of rules.values()) {
      const drop = r.t.length - WINDOW;
      if (drop > 0) { r.t.splice(0, drop); r.c.forEach((a) => a.splice(0, drop)); }
    }
  }

  // padTo extends a rule's seconds with zeros up to t (seconds without decisions).
  function padTo(r, t) {
    if (!r.t.length) return;
    let next = r.t[r.t.length - 1] + 1;
    if (t - next >= WINDOW) next = t - WINDOW + 1;
    for (; next <= t; next++) { r.t.push(next); r.c.forEach((a) => a.push(0)); }
  }

  function chartWidth(box) { return Math.max(300, box.clientWidth || 600); }

  function drawCharts() {
    const host = $("charts");
    const filter = $("rule-filter").value;
    const shown = [...rules.values()].filter((r) => !filter || ruleKey(r.domain, r.rule) === filter);
    if (!shown.length) return;
    const empty = host.querySelector(".empty");
    if (empty) empty.remove();
    for (const r of rules.values()) {
      const visible = shown.includes(r);
      if (!r.box) {
        r.box = el("div", { class: "chart", "data-rule": r.rule, "data-domain": r.domain }, el("h3", {}, ruleLabel(r.domain, r.rule)));
        host.append(r.box);
      }
      r.box.hidden = !visible;
      if (!visible) continue;
      const data = [r.t, ...r.c];
      if (!r.plot) {
        const series = [{}].concat(outcomes.map((o) => ({ label: o.replace("_", "-"), stroke: COLORS[o] || "#333", width: 1.5, points: { show: false } })));
        r.plot = new uPlot({ width: chartWidth(host), height: 180, series: series, scales: { x: { time: true } }, axes: [{}, { size: 50 }], legend: { live: true } }, data, r.box);
      } else {
        r.plot.setData(data);
      }
    }
  }

  function updateRuleFilter() {
    const sel = $("rule-filter");
    const have = new Set([...sel.options].map((o) => o.value));
    for (const r of rules.values()) {
      const k = ruleKey(r.domain, r.rule);
      if (!have.has(k)) sel.append(el("option", { value: k }, ruleLabel(r.domain, r.rule)));
    }
  }

  // --- tracks: store- and server-level series (local tiers, shed) ---------
  const tracks = new Map(); // name → {t, c, plot, box}
  const TRACK_TITLES = {
    tiers: "Store tiers: Redis calls and decisions answered without one (the store's, every rule together)",
    shed: "Shed by the throttler (503), by criticality",
  };
  const TRACK_COLORS = { redis_calls: "#2874a6", near_cache: "#c0392b", write_back: "#2e8b57", local_share: "#d68910",
    CRITICAL_PLUS: "#7b241c", CRITICAL: "#c0392b", SHEDDABLE_PLUS: "#d68910", SHEDDABLE: "#566573" };

  function applyTracks(snap) {
    const host = $("tracks");
    for (const s of snap.tracks || []) {
      let tr = tracks.get(s.name);
      if (!tr) {
        tr = { t: [], c: s.labels.map(() => []), labels: s.labels,
          box: el("div", { class: "chart track", "data-track": s.name }, el("h3", {}, TRACK_TITLES[s.name] || s.name)) };
        tracks.set(s.name, tr);
        host.append(tr.box);
      }
      tr.total = s.total;
      while (tr.t.length && tr.t[tr.t.length - 1] >= s.start) { tr.t.pop(); tr.c.forEach((a) => a.pop()); }
      padTo(tr, s.start - 1);
      (s.counts || []).forEach((row, i) => { tr.t.push(s.start + i); row.forEach((v, j) => tr.c[j].push(v)); });
      const drop = tr.t.length - WINDOW;
      if (drop > 0) { tr.t.splice(0, drop); tr.c.forEach((a) => a.splice(0, drop)); }
      const data = [tr.t, ...tr.c];
      if (!tr.plot) {
        const series = [{}].concat(tr.labels.map((l) => ({ label: l.replace(/_/g, "-").toLowerCase(), stroke: TRACK_COLORS[l] || "#333", width: 1.5, points: { show: false } })));
        tr.plot = new uPlot({ width: chartWidth(host.parentElement), height: 160, series: series, scales: { x: { time: true } }, axes: [{}, { size: 50 }], legend: { live: true } }, data, tr.box);
      } else {
        tr.plot.setData(data);
      }
    }
    host.hidden = tracks.size === 0;
  }

  // --- latency ------------------------------------------------------------
  const latency = { t: [], p50: [], p99: [], plot: null };

  function applyLatency(l) {
    if (!l || !l.start) return;
    while (latency.t.length && latency.t[latency.t.length - 1] >= l.start) { latency.t.pop(); latency.p50.pop(); latency.p99.pop(); }
    (l.p50_us || []).forEach((v, i) => { latency.t.push(l.start + i); latency.p50.push(v); latency.p99.push(l.p99_us[i]); });
    const drop = latency.t.length - WINDOW;
    if (drop > 0) { latency.t.splice(0, drop); latency.p50.splice(0, drop); latency.p99.splice(0, drop); }
    const data = [latency.t, latency.p50, latency.p99];
    if (!latency.plot) {
      $("latency-chart").append(el("h3", {}, "Decision latency (µs, upper bound of a power-of-two bucket)"));
      latency.plot = new uPlot({ width: chartWidth($("latency-chart")), height: 140,
        series: [{}, { label: "p50", stroke: "#2874a6" }, { label: "p99", stroke: "#c0392b" }], axes: [{}, { size: 60 }], scales: { x: { time: true } } }, data, $("latency-chart"));
    } else {
      latency.plot.setData(data);
    }
  }

  // --- top keys -----------------------------------------------------------
  function drawTop(top) {
    const host = $("top-keys");
    const withKeys = (top || []).filter((r) => r.keys && r.keys.length);
    if (!withKeys.length) { host.replaceChildren(el("p", { class: "empty" }, "No key has been limited.")); return; }
    const blocks = withKeys.map((r) => {
      const max = r.keys[0].count || 1;
      const rows = r.keys.map((k) => el("tr", { class: "top-key" },
        el("td", { class: "key" }, k.key),
        el("td", { class: "num" }, el("span", { class: "bar", style: "width:" + Math.max(2, Math.round(80 * k.count / max)) + "px" }), k.count.toLocaleString()),
        el("td", { class: "num", title: "the count may overstate by this much" }, k.error ? "±" + k.error.toLocaleString() : "")));
      return el("div", { class: "rule-top", "data-rule": r.rule },
        el("h3", {}, ruleLabel(r.domain, r.rule)),
        el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Key"), el("th", {}, "Limited"), el("th", {}, "Error"))), el("tbody", {}, ...rows)));
    });
    host.replaceChildren(...blocks);
  }

  // --- health -------------------------------------------------------------
  function drawHealth(h) {
    const items = [["Store", h.store]];
    if (h.breaker) items.push(["Breaker", el("span", { class: h.breaker === "open" ? "open" : "closed", id: "breaker" }, h.breaker)]);
    items.push(["Ready", h.ready ? "yes" : "no" + (h.ready_text ? " (" + h.ready_text + ")" : "")]);
    if (h.store === "redis") {
      items.push(["Calls", h.calls.toLocaleString()], ["Errors", (h.errors || 0).toLocaleString()], ["Timeouts", (h.timeouts || 0).toLocaleString()],
        ["Breaker opens", (h.breaker_opens || 0).toLocaleString()], ["Call timeout", (h.timeout_ms || 0).toFixed(1) + " ms"], ["Scheduling lag", (h.lag_ms || 0).toFixed(1) + " ms"]);
    } else {
      items.push(["Keys", (h.keys || 0).toLocaleString()], ["Table bytes", (h.bytes || 0).toLocaleString()], ["New keys refused at a cap", (h.refused || 0).toLocaleString()]);
    }
    items.push(["Degraded decisions", (h.degraded || 0).toLocaleString()]);
    $("health-list").replaceChildren(...items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  // --- rules --------------------------------------------------------------
  function drawRules(rs) {
    $("rules").hidden = !rs;
    if (!rs) return;
    const r = rs.reload || {};
    const when = r.time ? new Date(r.time).toLocaleString() : "never";
    $("reload").replaceChildren(el("span", { class: r.ok ? "good" : "error", id: "reload-result" },
      "Last load " + when + ": " + (r.ok ? "ok" : "refused: " + (r.error || "?"))));
    const rows = (rs.limits || []).map((l) => el("tr", {},
      el("td", {}, l.domain), el("td", {}, l.name), el("td", {}, l.text + (l.mode ? " (" + l.mode + ")" : "")), el("td", {}, l.file + ":" + l.line)));
    $("rules-table").tBodies[0].replaceChildren(...rows);
  }

  // --- snapshots ----------------------------------------------------------
  let gotFirst = false;
  function applySnapshot(snap) {
    $("server").textContent = snap.server ? "· " + snap.server : "";
    document.body.classList.toggle("no-admin", !(snap.panels && snap.panels.admin));
    applySeries(snap);
    updateRuleFilter();
    drawCharts();
    applyTracks(snap);
    $("latency-chart").hidden = !(snap.panels && snap.panels.latency);
    if (snap.panels && snap.panels.latency) applyLatency(snap.latency);
    drawTop(snap.top);
    drawHealth(snap.health || {});
    drawRules(snap.rules);
    if (!gotFirst) { gotFirst = true; document.body.dataset.ready = "1"; window.floodgate.readyAt = performance.now(); }
    document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
    window.floodgate.last = snap;
  }

  function connect() {
    const es = new EventSource("events");
    es.addEventListener("snapshot", (e) => {
      $("status").textContent = "live";
      $("status").className = "status live";
      applySnapshot(JSON.parse(e.data));
    });
    es.addEventListener("expired", () => { es.close(); sessionLost(); });
    es.onerror = async () => {
      $("status").textContent = "disconnected: retrying";
      $("status").className = "status down";
      try {
        const r = await fetch("session", { credentials: "same-origin" });
        if (r.status === 401) { es.close(); sessionLost(); }
      } catch (e) { /* the server is away: EventSource retries */ }
    };
  }

  // --- key inspector ------------------------------------------------------
  function parseEntries(s) {
    return s.trim().split(/\s+/).filter(Boolean).map((kv) => {
      const i = kv.indexOf("=");
      return i < 0 ? { key: kv, value: "" } : { key: kv.slice(0, i), value: kv.slice(i + 1) };
    });
  }

  async function keyCall(kind) {
    const body = { domain: $("inspect-domain").value.trim(), entries: parseEntries($("inspect-entries").value) };
    const out = $("inspect-result");
    const r = await api("/v1/keys/" + kind, { method: "POST", body: body });
    if (!r.ok) { out.replaceChildren(el("p", { class: "error", id: "inspect-error" }, errorText(r))); return null; }
    return r.body;
  }

  function showState(st, note) {
    const rows = Object.entries(st).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { "data-field": k }, typeof v === "object" ? JSON.stringify(v) : String(v))));
    const parts = [el("table", { id: "inspect-state" }, el("tbody", {}, ...rows))];
    if (note) parts.unshift(el("p", { class: "good" }, note));
    $("inspect-result").replaceChildren(...parts);
  }

  async function inspect(e) {
    if (e) e.preventDefault();
    const st = await keyCall("inspect");
    if (st) showState(st);
  }

  async function reset() {
    if (!$("inspect-form").reportValidity()) return;
    const st = await keyCall("reset");
    if (!st) return;
    const after = await keyCall("inspect");
    if (after) showState(after, "Reset: the key starts afresh.");
  }

  // --- overrides ----------------------------------------------------------
  let ovrAfter = "";
  // listOverrides lists a page of the domain's overrides (the next page
  // with more); quiet keeps the message of the change that asked for it.
  // A search is the server's (?q=: a substring of the key or note, any
  // case), over every override of the domain, not the pages shown.
  async function listOverrides(e, more, quiet) {
    if (e) e.preventDefault();
    const domain = $("ovr-domain").value.trim();
    if (!domain) return;
    if (!more) { ovrAfter = ""; $("ovr-table").tBodies[0].replaceChildren(); }
    const filter = $("ovr-filter").value.trim();
    let q = "?limit=100" + (ovrAfter ? "&after=" + encodeURIComponent(ovrAfter) : "");
    if (filter) q += "&q=" + encodeURIComponent(filter);
    const r = await api("/v1/overrides/" + encodeURIComponent(domain) + q);
    if (!r.ok) { message(errorText(r), true); return; }
    // filtered: {overrides, next, scanned}; else a page of at most 100
    const list = (filter ? r.body && r.body.overrides : r.body) || [];
    for (const o of list) {
      $("ovr-table").tBodies[0].append(el("tr", { "data-key": o.key },
        el("td", {}, o.key), el("td", { class: "num" }, o.limit), el("td", {}, o.period || ""), el("td", { class: "num" }, o.burst || ""),
        el("td", {}, o.algorithm || ""), el("td", {}, o.note || ""),
        el("td", {}, el("button", { type: "button", class: "danger", onclick: () => deleteOverride(domain, o.key) }, "Delete"),
          el("button", { type: "button", onclick: () => editOverride(o) }, "Edit"))));
    }
    if (filter) {
      ovrAfter = r.body.next || "";
      $("ovr-more").hidden = !ovrAfter;
    } else {
      ovrAfter = list.length ? list[list.length - 1].key : "";
      $("ovr-more").hidden = list.length < 100;
    }
    $("overrides").setAttribute("data-listed", String(Number($("overrides").getAttribute("data-listed") || 0) + 1));
    if (quiet) return;
    if (list.length) message("", false);
    else if (filter && ovrAfter) message("None found in the first overrides searched; More searches on.", false);
    else message("No overrides" + (filter ? " matching " + filter : "") + (more ? " more." : " in " + domain + "."), false);
  }

  function editOverride(o) {
    $("ovr-key").value = o.key;
    $("ovr-limit").value = o.limit;
    $("ovr-period").value = o.period || "";
    $("ovr-burst").value = o.burst || "";
    $("ovr-algorithm").value = o.algorithm || "";
    $("ovr-note").value = o.note || "";
  }

  function message(text, bad) {
    const m = $("ovr-message");
    m.textContent = text;
    m.className = "message " + (bad ? "error" : "good");
  }

  async function setOverride(e) {
    e.preventDefault();
    const domain = $("ovr-domain").value.trim();
    const key = $("ovr-key").value.trim();
    if (!domain) { message("domain: give the override's domain above", true); $("ovr-domain").focus(); return; }
    const body = {};
    if ($("ovr-limit").value !== "") body.limit = Number($("ovr-limit").value);
    if ($("ovr-period").value.trim()) body.period = $("ovr-period").value.trim();
    if ($("ovr-burst").value !== "") body.burst = Number($("ovr-burst").value);
    if ($("ovr-algorithm").value.trim()) body.algorithm = $("ovr-algorithm").value.trim();
    if ($("ovr-note").value.trim()) body.note = $("ovr-note").value.trim();
    const r = await api("/v1/overrides/" + encodeURIComponent(domain) + "/" + encodeURIComponent(key), { method: "PUT", body: body });
    if (!r.ok) { message(errorText(r), true); return; }
    message("Set " + key + " in " + domain + ".", false);
    listOverrides(null, false, true);
  }

  async function deleteOverride(domain, key) {
    const r = await api("/v1/overrides/" + encodeURIComponent(domain) + "/" + encodeURIComponent(key), { method: "DELETE" });
    if (!r.ok) { message(errorText(r), true); return; }
    message("Deleted " + key + ".", false);
    listOverrides(null, false, true);
  }

  // --- start --------------------------------------------------------------
  // plotted sums what each rule's chart holds, by outcome (for tests and the console)
  function plotted() {
    return [...rules.values()].map((r) => ({ domain: r.domain, rule: r.rule, points: r.t.length,
      sums: Object.fromEntries(outcomes.map((o, i) => [o, r.plot ? r.plot.data[i + 1].reduce((a, b) => a + (b || 0), 0) : 0])) }));
  }
  // plottedTracks sums what each track's chart holds, by label
  function plottedTracks() {
    return [...tracks.entries()].map(([name, tr]) => ({ name: name, points: tr.t.length,
      sums: Object.fromEntries(tr.labels.map((l, i) => [l, tr.plot ? tr.plot.data[i + 1].reduce((a, b) => a + (b || 0), 0) : 0])) }));
  }
  window.floodgate = { api: api, el: el, last: null, plotted: plotted, plottedTracks: plottedTracks };
  $("rule-filter").addEventListener("change", drawCharts);
  $("inspect-form").addEventListener("submit", inspect);
  $("reset-button").addEventListener("click", reset);
  $("override-search").addEventListener("submit", (e) => listOverrides(e, false));
  $("ovr-more").addEventListener("click", () => listOverrides(null, true));
  $("override-form").addEventListener("submit", setOverride);
  // keep the session alive while the page is open
  setInterval(() => fetch("session", { credentials: "same-origin" }).then((r) => { if (r.status === 401) sessionLost(); }), 10 * 60 * 1000);
  connect();
})();
