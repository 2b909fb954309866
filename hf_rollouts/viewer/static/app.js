// hf_rollouts viewer. Hand-written, no dependencies. Every piece of dataset text reaches the page through
// textContent / createTextNode (el() below); nothing here assigns innerHTML, and no link takes its address from data.
"use strict";

const STATIC = document.getElementById("hfr-data");
const DATA = STATIC ? JSON.parse(STATIC.textContent) : null;
const main = document.getElementById("main");
const tip = document.getElementById("tip");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(x, digits = 4) {
  if (x === null || x === undefined) return "n/a";
  if (typeof x !== "number") return String(x);
  return Number.isInteger(x) ? String(x) : x.toFixed(digits);
}
function pct(x) { return x === null || x === undefined ? "n/a" : (100 * x).toFixed(1) + "%"; }
function interval(iv, f = pct) { return iv ? ` [${f(iv[0])}, ${f(iv[1])}]` : ""; }
function statusBadge(s) { return el("span", { class: "status " + s, text: s }); }
function pretty(value) { return typeof value === "string" ? value : JSON.stringify(value, null, 2); }

// -- data: the server's JSON API, or the answers embedded by `--html` ------------------------------------
async function api(path, params) {
  params = params || {};
  if (DATA) return staticAnswer(path, params);
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => qs.append(k, x)); else if (v !== "" && v !== undefined) qs.set(k, v);
  }
  const response = await fetch("api/" + path + "?" + qs.toString());
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function staticAnswer(path, p) {
  const ds = p.ds || 0;
  const key = { info: "info", summary: `summary/${ds}`, tasks: `tasks/${ds}`, group: `group/${ds}/${p.row}`,
    rollout: `rollout/${ds}/${p.row}/${p.i}`, compare: "compare" }[path];
  const answer = DATA[key];
  if (answer === undefined) throw new Error("not in this page: " + key);
  if (path === "tasks") return queryTasks(answer, p);
  if (path === "compare") return queryCompare(answer, p);
  return answer;
}

function compareValues(a, b) { return a < b ? -1 : a > b ? 1 : 0; }
function sortRows(rows, key, desc) {
  const known = rows.filter((r) => r[key] !== null && r[key] !== undefined);
  const unknown = rows.filter((r) => r[key] === null || r[key] === undefined);
  known.sort((a, b) => (desc ? -1 : 1) * compareValues(a[key], b[key]));
  return known.concat(unknown);
}
function matches(value, op, target) {
  if (value === null || value === undefined) return false;
  if (op === "has") return String(value).toLowerCase().includes(target.toLowerCase());
  const num = typeof value !== "string" && target !== "" && !isNaN(Number(target));
  const [l, r] = num ? [Number(value), Number(target)] : [String(value), target];
  return { eq: l === r, ne: l !== r, lt: l < r, le: l <= r, gt: l > r, ge: l >= r }[op];
}
function queryTasks(all, p) {
  let rows = all.rows.filter((r) => (!p.status || r.statuses.includes(p.status)) && (!p.env || r.env === p.env));
  if (p.q) rows = rows.filter((r) => r.text.toLowerCase().includes(p.q.toLowerCase()));
  for (const clause of [].concat(p.where || [])) {
    const [name, op, ...rest] = clause.split(":");
    rows = rows.filter((r) => matches(r[name], op, rest.join(":")));
  }
  rows = sortRows(rows, p.sort || "row", p.desc === "1");
  const offset = Number(p.offset || 0), limit = Number(p.limit || 50);
  return { total: rows.length, offset, columns: all.columns, rows: rows.slice(offset, offset + limit) };
}
function queryCompare(all, p) {
  const sort = !p.sort || p.sort === "row" ? "pair" : p.sort;  // the server's "row" order is the pairs' order
  const rows = sortRows(all.rows, sort, p.desc === "1");
  const offset = Number(p.offset || 0), limit = Number(p.limit || 50);
  return Object.assign({}, all, { offset, total: rows.length, rows: rows.slice(offset, offset + limit) });
}

// -- routing: #/view/a/b?k=v ----------------------------------------------------------------------------
function parseHash() {
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const params = {};
  for (const [k, v] of new URLSearchParams(query || "")) {
    if (k === "where") (params.where = params.where || []).push(v); else params[k] = v;
  }
  return { parts: path.split("/").filter(Boolean), params };
}
function go(parts, params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (Array.isArray(v)) v.forEach((x) => qs.append(k, x)); else if (v !== "" && v !== undefined && v !== null) qs.set(k, v);
  }
  const q = qs.toString();
  location.hash = "#/" + parts.join("/") + (q ? "?" + q : "");
}

let INFO = null;
async function route() {
  tip.hidden = true;
  const { parts, params } = parseHash();
  const view = parts[0] || "run";
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.id === "nav-" + view);
  try {
    if (!INFO) {
      INFO = await api("info");
      document.getElementById("label").textContent = INFO.datasets.join("  vs  ");
      document.getElementById("nav-compare").hidden = !INFO.compare;
    }
    const views = { run: showRun, tasks: showTasks, group: showGroup, rollout: showRollout, compare: showCompare };
    const node = await (views[view] || showRun)(parts, params);
    main.replaceChildren(node);
  } catch (err) {
    main.replaceChildren(el("p", { class: "error-text", id: "view-error", text: "Error: " + err.message }));
  }
}
window.addEventListener("hashchange", route);

// -- the run ----------------------------------------------------------------------------------------------
function stat(name, value, id, extra) {
  return el("div", { class: "card stat" }, el("div", { class: "value", id, text: value }),
    el("div", { class: "name", text: name }), extra ? el("div", { class: "muted", text: extra }) : null);
}
function histogram(h) {
  if (!h.counts.length) return el("p", { class: "muted", text: "no finite rewards" });
  const top = Math.max(...h.counts);
  const bars = h.counts.map((c, n) => el("div", { class: "bar", "data-count": c,
    title: `[${fmt(h.edges[n], 3)}, ${fmt(h.edges[n + 1], 3)}]: ${c} rollouts`,
    style: { height: (100 * c / top) + "%" } }));
  return el("div", { class: "card", id: "histogram" }, el("div", { class: "hist" }, bars),
    el("div", { class: "hist-axis" }, el("span", { text: fmt(h.edges[0], 3) }),
      el("span", { text: fmt(h.edges[h.edges.length - 1], 3) })));
}
function kvTable(rows, id) {
  return el("table", { id }, el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: v })))));
}

async function showRun(parts, params) {
  const ds = params.ds || 0;
  const s = await api("summary", { ds });
  const root = el("section", { id: "run" }, el("h2", { text: "Run" }), el("p", { class: "muted", text: s.label }),
    s.notes.map((n) => el("p", { class: "muted", text: n })));
  root.append(el("div", { class: "cards" },
    stat("tasks", fmt(s.tasks), "run-tasks"),
    stat("rollouts", fmt(s.rollouts), "run-rollouts", `${s.k} per task`),
    stat("mean final reward", fmt(s.mean_reward), "run-mean-reward",
      s.mean_reward_interval ? "95% CI" + interval(s.mean_reward_interval, (x) => fmt(x, 3)) : "errors excluded"),
    stat("solve rate (pass@1)", pct(s.solve_rate), "run-solve-rate",
      `${s.judged} rollouts judged` + interval(s.solve_rate_interval)),
    stat(`pass@${s.k}`, pct(s.pass_at_k), "run-pass-at-k", `${s.judged_tasks} tasks judged` + interval(s.pass_at_k_interval))));
  const statuses = el("div", { class: "cards", id: "run-statuses" }, Object.entries(s.statuses).map(([name, n]) =>
    el("a", { class: "card stat", href: "#/tasks?status=" + encodeURIComponent(name), "data-status": name },
      el("div", { class: "value", text: n }), statusBadge(name))));
  root.append(el("h3", { text: "Statuses (click to list their tasks)" }), statuses);
  root.append(el("h3", { text: "Final reward distribution (rollouts; errors left out)" }), histogram(s.histogram));
  root.append(el("h3", { text: "Environments" }), kvTable(Object.entries(s.environments).map(([k, v]) => [k, v + " tasks"]), "run-envs"));
  root.append(el("h3", { text: "Statistics (as on the dataset card)" }));
  if (s.stats) root.append(kvTable(s.stats, "run-stats"));
  else if (s.stats_error) root.append(el("p", { class: "error-text", text: s.stats_error }));
  else { root.append(el("p", { class: "muted", id: "run-stats-pending", text: "computing over every rollout…" }));
    setTimeout(() => { if (parseHash().parts.length === 0 || parseHash().parts[0] === "run") route(); }, 1000); }
  root.append(el("h3", { text: "Sampling settings (recorded per rollout)" }));
  root.append(s.sampling.length ? kvTable(s.sampling.map((x) => [x.rollouts + " rollouts", JSON.stringify(x.settings)]), "run-sampling")
    : el("p", { class: "muted", text: "no logprob_settings column" }));
  root.append(el("h3", { text: "Dataset card" }));
  const card = s.card || {};
  if (card.error) root.append(el("p", { class: "error-text", id: "run-card-error", text: "The card's header was not read: " + card.error }));
  if (card.settings || card.header) {
    const rows = Object.entries(card.header || {}).map(([k, v]) => [k, Array.isArray(v) ? v.join(", ") : v]);
    if (card.version) rows.push(["hf_rollouts version", card.version]);
    root.append(kvTable(rows.concat(card.settings || []), "run-card"));
  } else root.append(el("p", { class: "muted", text: "no README.md card beside the data" }));
  return root;
}

// -- the task table ---------------------------------------------------------------------------------------
const OPS = { eq: "=", ne: "≠", lt: "<", le: "≤", gt: ">", ge: "≥", has: "contains" };
async function showTasks(parts, params) {
  const ds = params.ds || 0;
  const p = Object.assign({ sort: "row", desc: "", offset: 0, limit: 50 }, params);
  const page = await api("tasks", p);
  const set = (changes) => go(["tasks"], Object.assign({}, p, { offset: 0 }, changes));
  const root = el("section", { id: "tasks" }, el("h2", { text: "Tasks" }));
  const search = el("input", { id: "task-search", type: "search", placeholder: "search the conversations", value: p.q || "" });
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") set({ q: search.value }); });
  const status = el("select", { id: "task-status", onchange: (e) => set({ status: e.target.value }) },
    ["", "done", "truncated", "error"].map((s) => el("option", { value: s, selected: s === (p.status || ""), text: s || "any status" })));
  const column = el("select", { id: "filter-column" }, page.columns.map((c) => el("option", { value: c, text: c })));
  const op = el("select", { id: "filter-op" }, Object.entries(OPS).map(([k, v]) => el("option", { value: k, text: v })));
  const value = el("input", { id: "filter-value", placeholder: "value", size: 8 });
  const where = [].concat(p.where || []);
  const add = el("button", { id: "filter-add", text: "add filter",
    onclick: () => set({ where: where.concat([`${column.value}:${op.value}:${value.value}`]) }) });
  root.append(el("div", { class: "controls" }, search, el("button", { id: "search-go", text: "search", onclick: () => set({ q: search.value }) }),
    status, el("span", { class: "muted", text: "filter:" }), column, op, value, add));
  if (where.length || p.env) {
    root.append(el("div", { class: "controls filters" }, where.map((w, n) => {
      const [c, o, ...v] = w.split(":");
      return el("span", { class: "filter" }, `${c} ${OPS[o] || o} ${v.join(":")} `,
        el("a", { href: "#", text: "×", onclick: (e) => { e.preventDefault(); set({ where: where.filter((_, m) => m !== n) }); } }));
    })));
  }
  const head = el("tr", {}, page.columns.map((c) => el("th", { class: "sortable", "data-column": c,
    text: c + (p.sort === c ? (p.desc === "1" ? " ▼" : " ▲") : ""),
    onclick: () => set({ sort: c, desc: p.sort === c && p.desc !== "1" ? "1" : "" }) })).concat([el("th", { text: "rollouts (final reward)" })]));
  const body = el("tbody", {}, page.rows.map((r) => el("tr", { class: "link", "data-row": r.row,
    onclick: () => go(["group", r.row], { ds }) },
  page.columns.map((c) => el("td", { class: typeof r[c] === "number" ? "num" : "", text: fmt(r[c]) })),
  el("td", {}, r.rewards.map((x, i) => el("span", { class: "chip " + r.statuses[i], title: r.statuses[i], text: fmt(x, 2) }))))));
  root.append(el("table", { id: "task-table" }, el("thead", {}, head), body));
  const first = page.total ? page.offset + 1 : 0, last = page.offset + page.rows.length;
  root.append(el("div", { class: "controls" },
    el("button", { id: "page-prev", disabled: page.offset === 0, text: "← previous",
      onclick: () => go(["tasks"], Object.assign({}, p, { offset: Math.max(0, page.offset - p.limit) })) }),
    el("span", { id: "page-info", text: `tasks ${first}–${last} of ${page.total}` }),
    el("button", { id: "page-next", disabled: last >= page.total, text: "next →",
      onclick: () => go(["tasks"], Object.assign({}, p, { offset: page.offset + Number(p.limit) })) })));
  return root;
}

// -- a group ----------------------------------------------------------------------------------------------
function rolloutCard(r, ds, row, open) {
  const infos = r.decision;
  const reason = infos && typeof infos === "object" ? (infos.reason ?? infos.error ?? null) : null;
  return el("div", { class: "card rollout-card", "data-rollout": r.rollout },
    el("h4", {}, `rollout ${r.rollout} `, statusBadge(r.status)),
    el("div", { class: "kv" },
      el("span", { class: "k", text: "final reward" }), el("span", { class: "reward", text: fmt(r.reward) }),
      el("span", { class: "k", text: "solved" }), el("span", { text: fmt(r.verdict) }),
      el("span", { class: "k", text: "GRPO advantage" }), el("span", { class: "advantage", text: fmt(r.advantage) }),
      el("span", { class: "k", text: "reward − group mean" }), el("span", { text: fmt(r.advantage_mean_baseline) }),
      el("span", { class: "k", text: "turns (cut)" }), el("span", { text: `${fmt(r.turns)} (${fmt(r.cut_turns)})` }),
      el("span", { class: "k", text: "tokens (agent)" }), el("span", { text: `${fmt(r.tokens)} (${fmt(r.agent_tokens)})` }),
      el("span", { class: "k", text: "tool calls" }), el("span", { text: fmt(r.calls) })),
    r.error ? el("pre", { class: "reason error", text: r.error }) : null,
    reason !== null ? el("pre", { class: "reason", text: "reason: " + pretty(reason) }) : null,
    infos !== null && infos !== undefined ? el("details", { open: true }, el("summary", { text: "infos (the verifier's decision)" }),
      el("pre", { class: "infos", text: pretty(infos) })) : null,
    el("div", { class: "muted", text: "last reply" }), el("pre", { class: "last-reply", text: r.last_reply }),
    open ? el("button", { class: "open-rollout", text: "open rollout →", onclick: () => go(["rollout", row, r.rollout], { ds }) }) : null);
}

function groupBlock(g, ds) {
  return el("div", {},
    el("details", { open: true }, el("summary", { text: "task" }),
      el("pre", { class: "task", text: `${g.task.env_class_path}\nenv_config: ${g.task.env_config}\n` +
        `task_data: ${g.task.task_data}` + Object.entries(g.extra).map(([k, v]) => `\n${k}: ${v}`).join("") })),
    el("div", { class: "group" }, g.rollouts.map((r) => rolloutCard(r, ds, g.row, true))));
}

async function showGroup(parts, params) {
  const ds = params.ds || 0, row = Number(parts[1]);
  const g = await api("group", { ds, row });
  return el("section", { id: "group", "data-row": row }, el("h2", { text: `Task ${row}: its group of ${g.rollouts.length} rollouts` }),
    el("p", {}, el("a", { href: "#/tasks", text: "← tasks" })), groupBlock(g, ds));
}

// -- one rollout ------------------------------------------------------------------------------------------
function tokenColour(t, by, scale) {
  if (by === "logprob") {
    if (t.logprob === null) return "";
    const p = Math.exp(t.logprob);
    return `hsl(${Math.round(120 * p)}, 75%, 78%)`;
  }
  if (by === "reward") {
    if (!t.reward) return "";
    const a = Math.min(1, Math.abs(t.reward) / (scale || 1));
    return t.reward > 0 ? `rgba(43, 138, 62, ${0.15 + 0.7 * a})` : `rgba(201, 42, 42, ${0.15 + 0.7 * a})`;
  }
  return "";
}
function showTip(event, t, kind) {
  const lines = [`token  ${JSON.stringify(t.text === null ? "#" + t.id : t.text)}`, `id     ${t.id}`, `pos    ${t.position}`,
    `kind   ${kind}`];
  if (t.logprob !== null) lines.push(`logprob ${fmt(t.logprob, 6)}`, `prob    ${fmt(Math.exp(t.logprob), 4)}`);
  lines.push(`reward ${fmt(t.reward, 4)}`);
  tip.textContent = lines.join("\n");
  tip.hidden = false;
  tip.style.left = Math.min(event.clientX + 12, window.innerWidth - 260) + "px";
  tip.style.top = (event.clientY + 16) + "px";
}

function tokensView(r, by) {
  const scale = Math.max(1e-9, ...r.segments.flatMap((s) => s.tokens.map((t) => Math.abs(t.reward || 0))));
  const names = { agent: "agent (sampled)", env: "environment / prompt", tool: "tool result" };
  return el("div", { class: "tokens", id: "tokens" }, r.segments.map((seg) => el("div", { class: "segment " + seg.kind },
    el("span", { class: "seg-label", text: `${names[seg.kind]} · ${seg.tokens.length} tokens` }),
    seg.tokens.map((t) => el("span", { class: "tok " + seg.kind, "data-id": t.id, "data-pos": t.position,
      style: { background: tokenColour(t, by, scale) },
      onmouseenter: (e) => showTip(e, t, seg.kind), onmouseleave: () => { tip.hidden = true; } },
    t.text === null ? `#${t.id} ` : t.text)))));
}

function messageView(m) {
  return el("div", { class: "message " + m.role }, el("div", { class: "role", text: m.role + (m.name ? ` (${m.name})` : "") }),
    el("pre", { class: "content", text: m.content ?? "" }),
    (m.tool_calls || []).map((c) => el("pre", { class: "tool-call", text: `call ${c.function.name}(${c.function.arguments})` })));
}

async function showRollout(parts, params) {
  const ds = params.ds || 0, row = Number(parts[1]), i = Number(parts[2]);
  const by = params.color || "none";
  const r = await api("rollout", { ds, row, i });
  const nav = el("p", {}, el("a", { href: `#/group/${row}?ds=${ds}`, text: `← task ${row}'s group` }), "  ",
    i > 0 ? el("a", { id: "prev-rollout", href: `#/rollout/${row}/${i - 1}?ds=${ds}&color=${by}`, text: "← previous rollout" }) : null, "  ",
    i + 1 < r.rollouts ? el("a", { id: "next-rollout", href: `#/rollout/${row}/${i + 1}?ds=${ds}&color=${by}`, text: "next rollout →" }) : null);
  const facts = kvTable([["final reward", fmt(r.reward)], ["status", r.status], ["solved", fmt(r.verdict)],
    ["turns", fmt(r.turns)], ["turns cut by the token budget", fmt(r.cut_turns)],
    ["log-prob settings", r.sampling ? JSON.stringify(r.sampling) : "n/a"]], "rollout-facts");
  const root = el("section", { id: "rollout" }, el("h2", {}, `Task ${row}, rollout ${i} `, statusBadge(r.status)), nav, facts);
  if (r.error) root.append(el("h3", { text: "Error" }), el("pre", { class: "reason", id: "rollout-error", text: r.error }));
  if (r.status === "truncated") root.append(el("p", { class: "reason", id: "rollout-truncated",
    text: `truncated: the episode hit a limit (${fmt(r.turns)} turns played, ${fmt(r.cut_turns)} cut by the token budget)` }));
  root.append(el("h3", { text: "Verifier's decision (infos)" }),
    el("pre", { id: "rollout-infos", text: r.decision === null ? "none recorded" : pretty(r.decision) }));
  root.append(el("h3", { text: "Conversation" }), el("div", { id: "messages" }, r.messages.map(messageView)));
  if (r.calls.length) {
    root.append(el("h3", { text: "Tool calls" }), el("table", { id: "tool-calls" },
      el("thead", {}, el("tr", {}, ["turn", "tool", "arguments", "status", "seconds"].map((h) => el("th", { text: h })))),
      el("tbody", {}, r.calls.map((c) => el("tr", {}, [c.turn, c.name, c.arguments, c.status, fmt(c.seconds, 3)].map((v) => el("td", { text: v })))))));
  }
  const colour = el("select", { id: "colour-by", onchange: (e) => go(["rollout", row, i], { ds, color: e.target.value }) },
    [["none", "agent tokens marked"], ["logprob", "sampling log-prob"], ["reward", "per-token reward"]].map(([v, t]) =>
      el("option", { value: v, selected: v === by, text: "colour: " + t, disabled: v === "logprob" && !r.has_logprobs })));
  root.append(el("h3", { text: "Tokens (hover for id and values)" }), el("div", { class: "controls" }, colour,
    by === "logprob" ? el("span", { class: "legend muted" }, "p=0 ", el("span", { style: { background: "hsl(0,75%,78%)" } }),
      el("span", { style: { background: "hsl(60,75%,78%)" } }), el("span", { style: { background: "hsl(120,75%,78%)" } }), " p=1") : null,
    r.decoded ? null : el("span", { class: "muted", text: "no tokenizer: tokens shown by id (pass --tokenizer)" })),
  tokensView(r, by));
  return root;
}

// -- two runs compared ------------------------------------------------------------------------------------
async function showCompare(parts, params) {
  if (parts[1] !== undefined) return showPair(Number(parts[1]), params);
  const p = Object.assign({ sort: "delta", desc: "", offset: 0, limit: 50 }, params);
  const c = await api("compare", p);
  const set = (changes) => go(["compare"], Object.assign({}, p, { offset: 0 }, changes));
  const root = el("section", { id: "compare" }, el("h2", { text: "Compare: A (before) and B (after)" }),
    el("p", { class: "muted", text: INFO.datasets.map((d, n) => "AB"[n] + ": " + d).join("   ") }));
  root.append(el("div", { class: "cards" }, stat("tasks matched", fmt(c.matched), "cmp-matched", `only A ${c.only_a}, only B ${c.only_b}`),
    stat("mean reward A → B", `${fmt(c.mean_before, 3)} → ${fmt(c.mean_after, 3)}`, "cmp-means"),
    stat("mean change", fmt(c.mean_delta), "cmp-delta"),
    stat("improved / worse / same", `${c.improved} / ${c.worse} / ${c.same}`, "cmp-counts")));
  const cols = [["pair", "task"], ["env", "env"], ["before", "A mean reward"], ["after", "B mean reward"], ["delta", "change"]];
  const head = el("tr", {}, cols.map(([k, name]) => el("th", { class: k === "env" ? "" : "sortable", "data-column": k,
    text: name + (p.sort === k ? (p.desc === "1" ? " ▼" : " ▲") : ""),
    onclick: k === "env" ? null : () => set({ sort: k === "pair" ? "row" : k, desc: p.sort === k && p.desc !== "1" ? "1" : "" }) })));
  const body = el("tbody", {}, c.rows.map((r) => el("tr", { class: "link", "data-pair": r.pair, onclick: () => go(["compare", r.pair], {}) },
    el("td", { text: `A ${r.row_a} / B ${r.row_b}` }), el("td", { text: r.env }), el("td", { class: "num", text: fmt(r.before) }),
    el("td", { class: "num", text: fmt(r.after) }),
    el("td", { class: "num delta " + (r.delta > 0 ? "pos" : r.delta < 0 ? "neg" : ""), text: (r.delta > 0 ? "+" : "") + fmt(r.delta) }))));
  root.append(el("table", { id: "compare-table" }, el("thead", {}, head), body));
  const last = c.offset + c.rows.length;
  root.append(el("div", { class: "controls" },
    el("button", { disabled: c.offset === 0, text: "← previous", onclick: () => go(["compare"], Object.assign({}, p, { offset: Math.max(0, c.offset - p.limit) })) }),
    el("span", { text: `tasks ${c.total ? c.offset + 1 : 0}–${last} of ${c.total}` }),
    el("button", { disabled: last >= c.total, text: "next →", onclick: () => go(["compare"], Object.assign({}, p, { offset: last })) })));
  return root;
}

async function showPair(pair, params) {
  const c = await api("compare", { sort: "row", offset: pair, limit: 1 });
  const r = c.rows[0];
  if (!r) throw new Error("no task pair " + pair);
  const [a, b] = await Promise.all([api("group", { ds: 0, row: r.row_a }), api("group", { ds: 1, row: r.row_b })]);
  return el("section", { id: "pair" }, el("h2", { text: `Task A ${r.row_a} / B ${r.row_b}: mean reward ${fmt(r.before, 3)} → ${fmt(r.after, 3)}` }),
    el("p", {}, el("a", { href: "#/compare", text: "← comparison" })),
    el("div", { class: "side" }, el("div", { id: "pair-a" }, el("h3", { text: "A (before)" }), groupBlock(a, 0)),
      el("div", { id: "pair-b" }, el("h3", { text: "B (after)" }), groupBlock(b, 1))));
}

route();
