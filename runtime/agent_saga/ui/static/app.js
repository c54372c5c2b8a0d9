// The agent-saga debugger. Every value from the log is rendered with textContent: nothing
// from the log is ever parsed as HTML. The API is read-only; this page only reads.
"use strict";

(function () {
  const tokenMatch = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  if (tokenMatch) {
    sessionStorage.setItem("agent-saga-token", decodeURIComponent(tokenMatch[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  const token = sessionStorage.getItem("agent-saga-token");
  const state = { offset: 0, limit: 50, status: "", q: "", asof: null, records: 0, saga: null,
                  damage: null, selected: null, pageSize: 200, indexed: false };
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else if (k === "onclick") node.addEventListener("click", v);
      else node[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  async function api(path, params) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== "" && v !== undefined) url.searchParams.set(k, v);
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const res = await fetch(url, { headers });
    const body = await res.json();
    if (!res.ok) throw new Error(body.error || res.statusText);
    return body;
  }

  function show(v) {
    if (v === null || v === undefined) return "—";
    return typeof v === "string" ? v : JSON.stringify(v, null, 1);
  }

  function kv(pairs) {
    const box = el("div", { class: "kv" });
    for (const [k, v] of pairs) box.append(el("div", { class: "k" }, k), el("div", { class: "v" }, show(v)));
    return box;
  }

  function asofParam() { return state.asof === null ? null : state.asof; }

  // ------------------------------------------------------------------ status and time travel

  async function refreshStatus() {
    const s = await api("/api/status");
    state.records = s.records; state.damage = s.damage; state.pageSize = s.page_size; state.indexed = s.indexed;
    $("log-name").textContent = s.log;
    const chain = $("chain");
    if (!s.indexed) { chain.className = "chain"; chain.textContent = "verifying…"; }
    else if (s.verified) {
      chain.className = "chain ok";
      const c = s.chains[0];
      chain.textContent = "chain verified · head " + c.head.slice(0, 12) + "… · seq " + c.last_seq;
    } else {
      chain.className = "chain bad";
      chain.textContent = s.damage ? "chain BROKEN at " + s.damage.location : (s.error || "chain BROKEN");
    }
    $("show-break").hidden = !s.damage || s.damage.position < 0;
    $("progress").textContent = s.indexed
      ? s.records + " records · " + s.sagas + " sagas · indexed in " + (s.index_seconds || 0).toFixed(2) + " s"
      : "indexing… " + s.records + " records read";
    const slider = $("asof");
    slider.max = Math.max(0, s.records - 1);
    if (state.asof === null) slider.value = slider.max;
    $("asof-label").textContent = state.asof === null ? "latest (record " + s.records + ")" : "record " + (state.asof + 1) + " of " + s.records;
    return s;
  }

  // ------------------------------------------------------------------ the runs sidebar

  let runsRequest = 0;
  let timelineRequest = 0;  // the saga, events or log page the timeline was last asked for
  async function loadRuns() {
    const mine = ++runsRequest;
    const key = [state.status, state.q, state.offset, asofParam() === null ? "" : asofParam()].join("|");
    const r = await api("/api/sagas", { status: state.status, q: state.q, offset: state.offset, limit: state.limit, asof: asofParam() });
    if (mine !== runsRequest) return;  // a newer search is on its way: never show a stale one
    const list = $("runs");
    list.replaceChildren();
    for (const s of r.sagas) {
      const li = el("li", { class: "s-" + s.status + (state.saga === s.saga_id ? " sel" : ""), "data-saga": s.saga_id,
                            onclick: () => openSaga(s.saga_id) },
        el("div", { class: "id" }, s.saga_id),
        el("div", {}, el("span", { class: "badge" }, s.status), s.damaged ? el("span", { class: "badge warn" }, "tampered") : null,
           el("span", { class: "muted" }, s.records + " records" + (s.tools.length ? " · " + s.tools.join(", ") : ""))));
      list.append(li);
    }
    const counts = Object.entries(r.counts).map(([k, v]) => k + " " + v).join(" · ");
    $("counts").textContent = counts;
    $("page-label").textContent = r.total ? " " + (r.offset + 1) + "–" + (r.offset + r.sagas.length) + " of " + r.total + " " : " no runs ";
    $("prev").disabled = r.offset === 0;
    $("next").disabled = r.offset + r.sagas.length >= r.total;
    list.dataset.query = key;  // what the list shows (status|search|offset|as-of)
  }

  // ------------------------------------------------------------------ the timeline

  async function openSaga(id) {
    state.saga = id;
    const mine = ++timelineRequest;
    $("timeline").dataset.shown = "";
    const d = await api("/api/saga", { id, asof: asofParam() });
    if (mine !== timelineRequest) return;  // the timeline was asked for something newer since
    for (const li of document.querySelectorAll("#runs li")) li.classList.toggle("sel", li.dataset.saga === id);
    $("inspector").replaceChildren(el("p", { class: "muted" }, "Choose a step or a record."));  // never a stale step
    const t = $("timeline");
    t.replaceChildren(
      el("h2", {}, d.saga_id), el("div", {}, el("span", { class: "badge", id: "saga-status" }, d.status || "not started yet"),
        d.name ? el("span", { class: "muted" }, d.name + " ") : null,
        d.tags.length ? el("span", { class: "muted" }, "tags: " + d.tags.join(", ")) : null,
        d.damaged ? el("span", { class: "badge warn" }, "holds the first broken record") : null),
      legend(),
      el("div", { class: "lane" }, "forward (in order)"));
    const byPos = new Map(d.records.map((r) => [r.position, r]));
    for (const s of d.steps) {
      const box = el("div", { class: "step o-" + s.outcome, "data-step": s.step_id, "data-outcome": s.outcome,
                              onclick: () => inspectStep(s, byPos, box) },
        el("div", {}, el("b", {}, s.tool), " ", el("span", { class: "badge" }, s.semantics), el("span", { class: "badge" }, s.state)),
        el("div", { class: "muted" }, s.step_id + (s.error ? " · " + s.error : "")));
      t.append(box);
    }
    t.append(el("div", { class: "lane" }, "undo (last in, first out: in the order it ran)"));
    if (!d.undo.length) t.append(el("div", { class: "muted" }, "nothing was undone"));
    for (const u of d.undo) {
      t.append(el("div", { class: "step o-" + (u.type === "COMPENSATION_DONE" ? "compensated" : u.type === "COMPENSATION_FAILED" ? "failed" : "skipped"), "data-undo": u.step },
        el("b", {}, u.type), " ", el("span", { class: "muted" }, u.tool + " · " + u.step)));
    }
    t.dataset.shown = id + "|" + (asofParam() === null ? "" : asofParam());
    const proof = el("button", { type: "button", id: "proof", onclick: () => downloadProof(d.saga_id) }, "download disclosure proof");
    t.append(el("div", { class: "lane" }, "records (" + d.records.length + " of " + d.records_total + ")"), proof);
    for (const r of d.records) t.append(recordLine(r));
  }

  function legend() {
    const names = ["committed", "compensated", "orphaned", "failed", "unknown", "quarantined"];
    const box = el("div", { class: "legend muted" });
    for (const n of names) {
      const dot = el("span", { class: "dot" });
      dot.style.background = "var(--" + n + ")";
      box.append(el("span", {}, dot, n));
    }
    return box;
  }

  function recordLine(r) {
    const cls = "rec" + (r.broken ? " broken" : "") + (r.after_break ? " after" : "");
    const text = r.damaged ? "#" + (r.position + 1) + " DAMAGED " + r.reason
      : "#" + r.seq + " " + r.type + (r.step ? " " + r.step : "") + (r.redacted ? " [redacted]" : "") + (r.sealed ? " [encrypted]" : "") + (r.known ? "" : " [unknown type]");
    return el("div", { class: cls, "data-position": String(r.position), onclick: () => inspectRecord(r) }, text);
  }

  function inspectStep(s, byPos, box) {
    for (const b of document.querySelectorAll(".step.sel")) b.classList.remove("sel");
    box.classList.add("sel");
    const a = $("inspector");
    a.replaceChildren(el("h3", {}, "step " + s.step_id),
      kv([["tool", s.tool], ["semantics", s.semantics], ["state", s.state], ["outcome", s.outcome],
          ["arguments (policy_args)", s.policy_args], ["idempotency key", s.idempotency_key],
          ["error", s.error]]),
      el("h3", {}, "compensation recorded at commit"), kv([["handler", s.compensation && s.compensation.handler],
          ["kwargs", s.compensation && s.compensation.kwargs], ["description", s.compensation && s.compensation.description]]));
    a.append(el("h3", {}, "gate"));
    if (!s.gate.length) a.append(el("div", { class: "muted" }, "no verdict recorded"));
    for (const g of s.gate) a.append(kv(Object.entries(g).filter(([k]) => k !== "position")));
    if (s.approvals.length) a.append(el("h3", {}, "approval"));
    for (const g of s.approvals) a.append(kv(Object.entries(g).filter(([k]) => k !== "position")));
    a.append(el("h3", {}, "compensation that ran"));
    if (!s.undo.length) a.append(el("div", { class: "muted" }, "none"));
    for (const u of s.undo) a.append(kv(Object.entries(u).filter(([k]) => !["position", "step", "tool"].includes(k))));
    a.append(el("h3", {}, "records"));
    for (const p of s.records) if (byPos.has(p)) a.append(recordLine(byPos.get(p)));
  }

  function inspectRecord(r) {
    const a = $("inspector");
    a.replaceChildren(el("h3", {}, r.damaged ? "damaged record" : "record #" + r.seq));
    if (r.broken) a.append(el("div", { class: "warn", id: "break-reason" }, "the chain breaks here: " + (state.damage ? state.damage.reason : r.reason)));
    if (r.after_break) a.append(el("div", { class: "warn" }, "after the first broken record: not verified"));
    if (r.damaged) { a.append(kv([["location", r.location], ["reason", r.reason]])); return; }
    a.append(kv([["type", r.type], ["saga", r.saga], ["step", r.step], ["time", new Date(r.ts / 1000).toISOString()],
                 ["hash", r.hash], ["prev", r.prev]]));
    if (r.redacted) a.append(el("div", { class: "redacted" }, "redacted: the payload was erased; the chain still verifies"));
    else if (r.sealed) a.append(el("div", { class: "redacted" }, "encrypted: start the debugger with the log's key to read it"));
    else a.append(el("h3", {}, "payload"), kv(Object.entries(r.payload || {})));
  }

  async function downloadProof(id) {
    const url = new URL("/api/proof", location.origin);
    url.searchParams.set("id", id);
    const res = await fetch(url, { headers: token ? { Authorization: "Bearer " + token } : {} });
    const text = await res.text();
    if (!res.ok) { $("inspector").replaceChildren(el("div", { class: "warn", id: "proof-error" }, JSON.parse(text).error)); return; }
    const link = el("a", { href: URL.createObjectURL(new Blob([text], { type: "application/json" })), download: "disclosure-" + id + ".json" });
    document.body.append(link); link.click(); link.remove();
  }

  async function showEvents() {
    const mine = ++timelineRequest;
    $("timeline").dataset.shown = "";
    const e = await api("/api/events", { asof: asofParam() });
    if (mine !== timelineRequest) return;
    const t = $("timeline");
    t.dataset.shown = "events";
    t.replaceChildren(el("h2", {}, "kill switch · breaker · WAL"));
    if (!e.events.length) t.append(el("div", { class: "muted" }, "no such records"));
    for (const r of e.events) t.append(recordLine(r));
  }

  async function showBreak() {
    if (!state.damage) return;
    const page = Math.floor(state.damage.position / state.pageSize);
    const mine = ++timelineRequest;
    $("timeline").dataset.shown = "";
    const p = await api("/api/log", { page });
    if (mine !== timelineRequest) return;
    const t = $("timeline");
    t.dataset.shown = "break";
    t.replaceChildren(el("h2", {}, "log page " + (page + 1)),
      el("div", { class: "warn" }, "first broken record: " + state.damage.location + " — " + state.damage.reason));
    let target = null;
    for (const r of p.records) { const line = recordLine(r); if (r.broken) target = line; t.append(line); }
    if (target) { target.scrollIntoView({ block: "center" }); inspectRecord(p.records.find((r) => r.broken)); }
  }

  // ------------------------------------------------------------------ wiring

  function rerender() { loadRuns().catch(fail); if (state.saga) openSaga(state.saga).catch(fail); }
  function fail(err) { $("inspector").replaceChildren(el("div", { class: "warn", id: "error" }, String(err.message || err))); }

  $("search").addEventListener("input", (e) => { state.q = e.target.value; state.offset = 0; loadRuns().catch(fail); });
  $("status-filter").addEventListener("change", (e) => { state.status = e.target.value; state.offset = 0; loadRuns().catch(fail); });
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); loadRuns().catch(fail); });
  $("next").addEventListener("click", () => { state.offset += state.limit; loadRuns().catch(fail); });
  $("asof").addEventListener("change", (e) => {
    const v = Number(e.target.value);
    state.asof = v >= state.records - 1 ? null : v;
    refreshStatus().then(rerender).catch(fail);
  });
  $("asof-latest").addEventListener("click", () => { state.asof = null; refreshStatus().then(rerender).catch(fail); });
  $("show-events").addEventListener("click", () => showEvents().catch(fail));
  $("show-break").addEventListener("click", () => showBreak().catch(fail));

  async function boot() {
    const s = await refreshStatus();
    await loadRuns();
    if (!s.indexed) setTimeout(() => boot().catch(fail), 500);
    else document.body.dataset.ready = "true";
  }
  boot().catch(fail);
})();
