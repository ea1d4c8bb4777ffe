// The "what if" panel (issue 22): paste a rules file, run it over the last
// minutes of recorded traffic (POST /v1/whatif on the admin API, through
// the dashboard's /dashboard/api/), and see per rule how many requests it
// would have refused, beside the live rules over the same requests.
// Plain JavaScript; the page's helpers are on window.floodgate (app.js).
"use strict";
(function () {
  const box = document.getElementById("whatif");
  if (!box || !window.floodgate) return;
  const api = window.floodgate.api;
  const el = window.floodgate.el;

  let runs = 0; // answers shown (data-runs on the panel: tests wait for it)
  const EXAMPLE = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

  box.className = "panel wide admin-only";
  const rulesText = el("textarea", { id: "whatif-rules", rows: "10", spellcheck: "false", placeholder: EXAMPLE, "aria-label": "Rules file (YAML)" });
  rulesText.style.width = "100%";
  rulesText.style.fontFamily = "ui-monospace, monospace";
  const minutes = el("input", { id: "whatif-minutes", type: "number", min: "0.1", step: "any", placeholder: "all recorded" });
  const run = el("button", { type: "submit", id: "whatif-run" }, "Run");
  const status = el("p", { id: "whatif-status", class: "message" });
  const errors = el("ul", { id: "whatif-errors", class: "error" });
  const result = el("div", { id: "whatif-result" });
  const form = el("form", { id: "whatif-form" },
    el("label", {}, "Minutes", minutes),
    run);
  box.append(
    el("h2", {}, "What if ", el("small", {}, "(a rules file over the recorded traffic: shadow mode without deploying)")),
    rulesText, form, status, errors, result);

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  function showErrors(r) {
    const b = r.body;
    if (b && typeof b === "object" && Array.isArray(b.errors) && b.errors.length) {
      for (const e of b.errors) {
        const li = el("li", { "data-line": String(e.line || 0) }, e.text || e.message);
        li.addEventListener("click", () => goToLine(e.line));
        errors.append(li);
      }
      return;
    }
    let text = "HTTP " + r.status;
    if (b && typeof b === "object" && b.error) text = b.error;
    else if (typeof b === "string" && b.trim()) text += ": " + b.trim();
    errors.append(el("li", {}, text));
  }

  // goToLine selects line n of the pasted file.
  function goToLine(n) {
    if (!n) return;
    const lines = rulesText.value.split("\n");
    let start = 0;
    for (let i = 0; i < n - 1 && i < lines.length; i++) start += lines[i].length + 1;
    const end = start + (lines[n - 1] || "").length;
    rulesText.focus();
    rulesText.setSelectionRange(start, end);
  }

  const COLS = [
    ["matched", "Matched"], ["allowed", "Allowed"], ["refused", "Refused"],
    ["shadow_refused", "Shadow-refused"], ["quota_violations", "Quota violations"], ["degraded", "Degraded"],
    ["overridden", "Under an override"],
  ];

  // table is one rule set's counts: a row per rule (data-rule: its name).
  function table(id, title, run) {
    const wrap = el("div", { id: id, class: "whatif-run" });
    if (!run.loaded) {
      wrap.append(el("h3", {}, title), el("p", { class: "empty" }, "These rules do not define the domain: nothing is limited."));
      return wrap;
    }
    const head = el("tr", {}, el("th", {}, "Rule"), el("th", {}, "Source"), ...COLS.map(([, t]) => el("th", {}, t)));
    const body = el("tbody");
    for (const r of run.rules) {
      const row = el("tr", { "data-rule": r.name },
        el("td", { class: "name" }, r.name + (r.shadow_mode ? " (shadow)" : "") + (r.quota_mode ? " (quota)" : "")),
        el("td", { class: "source" }, r.file ? r.file + ":" + r.line : ""),
        ...COLS.map(([k]) => el("td", { class: "num " + k, "data-count": k }, String(r[k] || 0))));
      body.append(row);
    }
    wrap.append(
      el("h3", {}, title + ": ", el("span", { class: "requests-refused" }, String(run.requests_refused)), " requests refused",
        run.invalid ? " (" + run.invalid + " malformed)" : "",
        run.requests_under_override ? el("span", { class: "under-override" }, " (" + run.requests_under_override + " decided under a key's override)") : ""),
      el("table", {}, el("thead", {}, head), body));
    return wrap;
  }

  function showResult(res) {
    const w = res.window;
    const from = new Date(w.truncated ? w.covers_from : w.from);
    let text = w.requests + " requests of domain " + res.domain + " replayed, from " + from.toLocaleTimeString() +
      " to " + new Date(w.to).toLocaleTimeString() + ".";
    if (res.overrides_applied) text += " Per-key overrides applied, as they are now.";
    if (res.override_lookup_failures) text += " " + res.override_lookup_failures + " keys' overrides could not be read: their rules decided them.";
    if (w.truncated) text += " The recorder's caps dropped older requests: the window covers the newest only.";
    if (!w.complete) text += " The replay ran out of time after " + w.replayed + " requests: the counts are of those.";
    status.textContent = text;
    status.className = "message" + (w.truncated || !w.complete ? " error" : "");
    result.append(table("whatif-candidate", "With these rules", res.candidate));
    result.append(table("whatif-current", "With the live rules", res.current));
  }

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    clear(errors); clear(result);
    const yaml = rulesText.value;
    if (!yaml.trim()) {
      errors.append(el("li", {}, "Paste a rules file first."));
      return;
    }
    let path = "/v1/whatif";
    const m = minutes.value.trim();
    if (m) path += "?minutes=" + encodeURIComponent(m);
    run.disabled = true;
    status.className = "message";
    status.textContent = "Replaying…";
    try {
      const r = await api(path, { method: "POST", body: yaml });
      status.textContent = "";
      if (!r.ok || !r.body || typeof r.body !== "object") { showErrors(r); return; }
      showResult(r.body);
    } catch (err) {
      status.textContent = "";
      errors.append(el("li", {}, "The request failed: " + err));
    } finally {
      run.disabled = false;
      box.setAttribute("data-runs", String(++runs));
    }
  });
})();
