// The dispatcher's dashboard. Plain script, no build step. Everything shown comes from
// /dashboard/api/..., asked with the viewer's token in the Authorization header; text from
// the cluster is only ever set as textContent (names and messages are users' input).
"use strict";

const PAGE = 100;
const REFRESH_MS = 5000;
const state = { token: "", namespaces: "", offset: 0, version: null, filters: {},
                timer: null, tab: "queue", detail: null, nowhere: "", shown: false };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
  return node;
}

function showProblem(text) {
  const p = document.getElementById("problem");
  p.textContent = text || "";
  p.hidden = !text;
}

async function api(path, params, namespaces = state.namespaces) {
  const query = new URLSearchParams(params || {});
  if (namespaces) query.set("namespaces", namespaces);
  const answer = await fetch(`api/${path}?${query}`, {
    headers: { Authorization: `Bearer ${state.token}` }, cache: "no-store",
    credentials: "omit", referrerPolicy: "no-referrer" });
  if (!answer.ok) {
    const text = (await answer.text()).trim();
    const error = new Error(`${answer.status}: ${text}`);
    error.status = answer.status;
    throw error;
  }
  return answer.json();
}

// --- the queue ---------------------------------------------------------------------------

function fillSelect(id, values, chosen, words) {
  const select = document.getElementById(id);
  const options = [el("option", { value: "" }, `all ${words}`)];
  for (const [value, count] of values) {
    const option = el("option", { value }, `${value} (${count})`);
    if (value === chosen) option.selected = true;
    options.push(option);
  }
  if (chosen && !values.some(([v]) => v === chosen)) {
    options.push(el("option", { value: chosen, selected: "" }, `${chosen} (0)`));
  }
  select.replaceChildren(...options);
}

function queueRow(item) {
  const open = el("a", { href: wrapperAddress(item.namespace, item.name),
                         "aria-label": `details of ${item.namespace}/${item.name}` },
                  `${item.namespace}/${item.name}`);
  const state = item.state === "held" ? `held by ${item.heldBy}` : "waiting";
  const eta = item.estimatedStart ? `${item.estimatedIn} (${item.estimatedStart})`
                                  : item.estimatedIn;
  return el("tr", { "data-key": `${item.namespace}/${item.name}` },
    el("td", { class: "num" }, item.position ?? "-"), el("td", {}, open),
    el("td", {}, state), el("td", {}, item.teams.join(", ") || "-"),
    el("td", {}, item.kinds.join(", ") || "-"), el("td", { class: "num" }, item.gpus),
    el("td", {}, item.waiting), el("td", {}, eta), el("td", { class: "why" }, item.why));
}

async function loadQueue() {
  const params = { offset: state.offset, limit: PAGE, ...state.filters };
  if (state.version !== null) params.since = state.version;
  const page = await api("queue", params);
  if (page.unchanged) return;
  state.version = page.version;
  fillSelect("f-namespace", page.facets.namespaces, state.filters.namespace, "namespaces");
  fillSelect("f-team", page.facets.teams, state.filters.team, "teams");
  fillSelect("f-kind", page.facets.kinds, state.filters.kind, "kinds");
  fillSelect("f-state", page.facets.states, state.filters.state, "states");
  document.querySelector("#queue-table tbody").replaceChildren(...page.items.map(queueRow));
  const last = Math.min(page.offset + page.items.length, page.total);
  document.getElementById("queue-summary").textContent =
    `${page.total} waiting shown of ${page.inScope} in ${page.scope ? page.scope.join(", ")
      : "all namespaces"}; policy ${page.policy}`;
  document.getElementById("page-label").textContent =
    page.total ? `${page.offset + 1}-${last} of ${page.total}` : "nothing waits";
  document.getElementById("prev").disabled = page.offset === 0;
  document.getElementById("next").disabled = last >= page.total;
}

function onFilter(name) {
  return (event) => {
    const filters = { ...state.filters };
    if (event.target.value) filters[name] = event.target.value;
    else delete filters[name];
    go(queueAddress(filters, 0));
  };
}

function turnPage(by) {
  go(queueAddress(state.filters, Math.max(0, state.offset + by)));
}

// --- timeline, teams, history ------------------------------------------------------------

function hours(seconds) {
  if (seconds == null) return "-";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor(s % 3600 / 60)}m`;
  return `${Math.floor(s / 86400)}d${Math.floor(s % 86400 / 3600)}h`;
}

async function loadTimeline() {
  const t = await api("timeline");
  const body = document.getElementById("timeline-body");
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => el("span", {},
    f === 0 ? "now" : `+${hours(t.span * f)}`));
  const rows = [el("div", { class: "axis", "aria-hidden": "true" }, el("span"),
                   el("div", { class: "axis-ticks" }, ...ticks))];
  for (const lane of t.lanes) {
    const bars = el("div", { class: "lane-bars" });
    for (const b of lane.bars) {
      const left = Math.max(0, b.from) / t.span * 100;
      const width = Math.max(0.5, (b.to - Math.max(0, b.from)) / t.span * 100);
      const words = `${b.namespace}/${b.name}: ${b.kind} from ${b.start} to ${b.end}`;
      const bar = el("div", { class: `bar ${b.kind}`, title: words, role: "img",
                              "aria-label": words }, b.name);
      bar.style.left = `${left}%`;
      bar.style.width = `${Math.min(width, 100 - left)}%`;
      bars.append(bar);
    }
    rows.push(el("div", { class: "lane" }, el("div", { class: "lane-name" }, lane.lane), bars));
  }
  if (!t.lanes.length) rows.push(el("p", {}, "Nothing runs or is estimated to start."));
  if (t.moreLanes) rows.push(el("p", {}, `and ${t.moreLanes} more node groups`));
  body.replaceChildren(...rows);
}

async function loadTeams() {
  const t = await api("teams");
  const rows = [];
  for (const node of t.nodes) {
    node.resources.forEach((r, i) => rows.push(el("tr", {},
      el("th", { scope: "row", class: `indent-${Math.min(node.depth, 4)}` },
         i === 0 ? `${node.name} (${node.tree})` : ""),
      el("td", {}, r.resource), el("td", { class: "num" }, r.guaranteed),
      el("td", { class: "num" }, r.used), el("td", { class: "num" }, r.borrowed),
      el("td", { class: "num" }, r.lent))));
  }
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 6 }, "No quota trees.")));
  document.querySelector("#teams-table tbody").replaceChildren(...rows);
}

async function loadHistory() {
  const h = await api("history");
  const rows = h.teams.map((team) => {
    const all = team.hours.filter((x) => x.started);
    const started = all.reduce((n, x) => n + x.started, 0);
    const longest = Math.max(0, ...all.map((x) => x.longestSeconds));
    const medians = all.map((x) => x.medianSeconds).sort((a, b) => a - b);
    const top = Math.max(1, ...team.hours.map((x) => x.medianSeconds || 0));
    const spark = el("div", { class: "spark", role: "img",
      "aria-label": `median wait per hour for ${team.team}` },
      ...team.hours.map((x, i) => {
        const bar = el("span", { title: `${h.hours[i]}: ${hours(x.medianSeconds)}` });
        bar.style.height = `${(x.medianSeconds || 0) / top * 100}%`;
        return bar;
      }));
    return el("tr", {}, el("th", { scope: "row" }, team.team),
      el("td", { class: "num" }, started),
      el("td", {}, hours(medians[Math.floor((medians.length - 1) / 2)])),
      el("td", {}, hours(longest)), el("td", {}, spark));
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 5 }, "Nothing started in the last day.")));
  document.querySelector("#history-table tbody").replaceChildren(...rows);
}

// --- one AppWrapper ----------------------------------------------------------------------

function table(caption, head, rows) {
  return el("table", {}, el("caption", {}, caption),
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, ...(rows.length ? rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c))))
                                   : [el("tr", {}, el("td", { colspan: head.length }, "none"))])));
}

function notFound(ns, name, said) {
  document.getElementById("detail-body").replaceChildren(
    el("h2", {}, `${ns}/${name}`),
    el("p", { id: "detail-missing" }, `Not found: ${said.replace(/^404: /, "")}. It may have `
       + "been deleted, or the address names another AppWrapper."));
}

async function loadDetail() {
  if (!state.detail) return;
  const [ns, name] = state.detail;
  let a;
  try {
    // A shared link opened by a viewer who named no namespaces: asked as a viewer of the
    // AppWrapper's own namespace, the right a tenant has.
    a = await api(`appwrappers/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`, {},
                  state.namespaces || ns);
  } catch (e) {
    if (e.status !== 404) throw e;
    notFound(ns, name, e.message);
    return;
  }
  const here = wrapperAddress(a.namespace, a.name);
  const events = Array.isArray(a.events)
    ? table("Events", ["When", "Type", "Reason", "Count", "Message"],
            a.events.map((e) => [e.at, e.type, e.reason, e.count, e.message]))
    : el("p", { id: "detail-events" }, `Events: ${a.events}`);
  document.getElementById("detail-empty").hidden = true;
  document.getElementById("detail-body").replaceChildren(
    el("h2", {}, `${a.namespace}/${a.name}`),
    el("dl", {}, el("dt", {}, "State"), el("dd", {}, a.state || a.phase),
       el("dt", {}, "Held"), el("dd", {}, a.heldBy ? `by ${a.heldBy}` : "no"),
       el("dt", {}, "Position"), el("dd", {}, a.position ?? "-"),
       el("dt", {}, "Estimated start"), el("dd", {}, a.estimatedStart || "unknown"),
       el("dt", {}, "Wraps"), el("dd", {}, a.kinds.join(", ") || "-"),
       el("dt", {}, "Why it waits"), el("dd", { id: "detail-why" }, a.message || "-"),
       el("dt", {}, "This page"), el("dd", {}, el("a", { href: here, id: "detail-address" },
                                                 `${location.origin}${location.pathname}${here}`)),
       el("dt", {}, "If it were released"),
       el("dd", {}, "ask the planner: ", el("code", {}, a.whatIf))),
    table("Conditions, in order", ["When", "Type", "Status", "Reason", "Message"],
          a.conditions.map((c) => [c.at, c.type, c.status, c.reason, c.message])),
    events,
    table("Pods and their nodes", ["Pod", "Node", "Requests"],
          a.pods.map((p) => [p.name, p.node, Object.entries(p.requests)
            .map(([k, v]) => `${k}=${v}`).join(" ")])));
}

// --- addresses ---------------------------------------------------------------------------
// Each view has an address of its own in the fragment, so it can be bookmarked and sent:
// #/queue (its filters and page after "?"), #/timeline, #/teams, #/history, #/aw (none
// chosen) and #/aw/NAMESPACE/NAME. The addresses are built from the view alone: a token is
// never written into one.

const TITLES = { queue: "the queue", timeline: "the timeline", teams: "the teams",
                 history: "the history" };
const FILTERS = ["namespace", "team", "kind", "state"];
const CREDENTIALS = ["token", "namespaces"];

function wrapperAddress(ns, name) {
  return `#/aw/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
}

function queueAddress(filters, offset) {
  const query = new URLSearchParams();
  for (const name of FILTERS) if (filters[name]) query.set(name, filters[name]);
  if (offset) query.set("offset", offset);
  return `#/queue${query.toString() ? `?${query}` : ""}`;
}

function addressOf(tab) {
  if (tab === "queue") return queueAddress(state.filters, state.offset);
  if (tab === "detail") return state.detail ? wrapperAddress(...state.detail) : "#/aw";
  return `#/${tab}`;
}

// The fragment as [path, its parameters]; "#token=..." (no path) is how
// `kubectl appwrapper dashboard` passes a token.
function splitFragment(fragment) {
  const text = fragment.replace(/^#/, "");
  if (!text.startsWith("/")) return ["", new URLSearchParams(text)];
  const at = text.indexOf("?");
  return at < 0 ? [text, new URLSearchParams()]
                : [text.slice(0, at), new URLSearchParams(text.slice(at + 1))];
}

// Takes a token (and namespaces) out of the address into this tab's session storage, and
// drops them from the address bar and the history.
function takeCredentials() {
  const [path, params] = splitFragment(location.hash);
  if (!CREDENTIALS.some((name) => params.has(name))) return;
  if (params.get("token")) sessionStorage.setItem("token", params.get("token"));
  if (params.has("namespaces")) sessionStorage.setItem("namespaces", params.get("namespaces"));
  for (const name of CREDENTIALS) params.delete(name);
  const rest = params.toString() ? `?${params}` : "";
  history.replaceState(null, "", path || rest ? `${location.pathname}#${path}${rest}`
                                              : location.pathname);
  state.token = sessionStorage.getItem("token") || "";
  state.namespaces = sessionStorage.getItem("namespaces") || "";
  document.getElementById("namespaces").value = state.namespaces;
}

function decoded(part) {
  try { return decodeURIComponent(part); } catch { return null; }
}

// What the address names: { tab, detail, filters, offset }, or null when it names nothing.
function route(fragment) {
  const [given, params] = splitFragment(fragment);
  const path = given === "/" ? "" : given;
  const parts = path.split("/").slice(1).map(decoded);
  const [view, ...rest] = path ? parts : ["queue"];
  if (parts.includes(null) || parts.includes("")) return null;
  if (view === "queue" && !rest.length) {
    const offset = Number(params.get("offset") || 0);
    const known = [...params.keys()].every((k) => k === "offset" || FILTERS.includes(k));
    if (!known || !Number.isInteger(offset) || offset < 0) return null;
    const filters = Object.fromEntries(FILTERS.filter((k) => params.get(k))
                                              .map((k) => [k, params.get(k)]));
    return { tab: "queue", detail: null, filters, offset };
  }
  if (params.toString()) return null;
  if (view === "aw" && (rest.length === 0 || rest.length === 2)) {
    return { tab: "detail", detail: rest.length ? rest : null };
  }
  if (view in TITLES && view !== "queue" && !rest.length) return { tab: view };
  return null;
}

function follow() {
  takeCredentials();
  const to = route(location.hash);
  if (to === null) {
    state.nowhere = `No page at this address (${location.hash}): the views are #/queue, `
      + "#/timeline, #/teams, #/history and #/aw/NAMESPACE/NAME.";
    document.title = "dispatcher: no such page";
    select(null);
    return;
  }
  state.nowhere = "";
  if (to.tab === "queue") {
    state.filters = to.filters;
    state.offset = to.offset;
  }
  if (to.tab === "detail") {
    const same = to.detail && state.detail && to.detail.join("/") === state.detail.join("/");
    if (!same) document.getElementById("detail-body").replaceChildren();
    state.detail = to.detail;
    document.getElementById("detail-empty").hidden = Boolean(to.detail);
  }
  document.title = `dispatcher: ${to.tab === "detail"
    ? (state.detail ? state.detail.join("/") : "an AppWrapper") : TITLES[to.tab]}`;
  select(to.tab);
}

// Shows the view at `address`: a new entry in the history (back returns), or the same
// view asked again.
function go(address) {
  if (location.hash === address) follow();
  else location.hash = address;  // hashchange follows it
}

// --- tabs, sign-in, refresh --------------------------------------------------------------

const LOADERS = { queue: loadQueue, timeline: loadTimeline, teams: loadTeams,
                  history: loadHistory, detail: loadDetail };

async function refresh() {
  if (state.nowhere) {
    showProblem(state.nowhere);
    return;
  }
  if (!state.token) {
    showProblem("Enter a bearer token to see the queue.");
    return;
  }
  try {
    await LOADERS[state.tab]();
    showProblem("");
  } catch (e) {
    showProblem(e.message);
  }
}

function select(tab) {
  state.tab = tab;
  document.querySelectorAll("[role=tab]").forEach((button, i) => {
    const on = button.getAttribute("aria-controls") === tab;
    button.setAttribute("aria-selected", String(on));
    button.tabIndex = on || (tab === null && i === 0) ? 0 : -1;  // one reachable by Tab
    document.getElementById(button.getAttribute("aria-controls")).hidden = !on;
    // The page opened at an address keeps the focus where the browser puts it.
    if (on && state.shown) button.focus();
  });
  state.shown = true;
  state.version = null;
  refresh();
}

function onTabKey(event) {
  const tabs = [...document.querySelectorAll("[role=tab]")];
  const at = tabs.indexOf(event.target);
  const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: tabs.length - 1 }[event.key];
  if (to === undefined) return;
  event.preventDefault();
  go(addressOf(tabs[(to + tabs.length) % tabs.length].getAttribute("aria-controls")));
}

function signIn(event) {
  event.preventDefault();
  state.token = document.getElementById("token").value.trim();
  state.namespaces = document.getElementById("namespaces").value.replace(/\s+/g, "");
  sessionStorage.setItem("token", state.token);
  sessionStorage.setItem("namespaces", state.namespaces);
  state.version = null;
  refresh();
}

function start() {
  state.token = sessionStorage.getItem("token") || "";
  state.namespaces = sessionStorage.getItem("namespaces") || "";
  document.getElementById("namespaces").value = state.namespaces;
  document.getElementById("login").addEventListener("submit", signIn);
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.clear();
    state.token = "";
    document.getElementById("token").value = "";
    refresh();
  });
  for (const button of document.querySelectorAll("[role=tab]")) {
    button.addEventListener("click", () => go(addressOf(button.getAttribute("aria-controls"))));
    button.addEventListener("keydown", onTabKey);
  }
  for (const name of ["namespace", "team", "kind", "state"]) {
    document.getElementById(`f-${name}`).addEventListener("change", onFilter(name));
  }
  document.getElementById("prev").addEventListener("click", () => turnPage(-PAGE));
  document.getElementById("next").addEventListener("click", () => turnPage(PAGE));
  // `kubectl appwrapper dashboard` opens the page with the token in the fragment, which
  // browsers never send: follow() takes it out of the address first.
  window.addEventListener("hashchange", follow);
  follow();
  state.timer = setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", start);
