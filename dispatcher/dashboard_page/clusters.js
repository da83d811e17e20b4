// The manager's Clusters view. Plain script, no build step. Everything shown comes from
// /dashboard/api/clusters, asked with the viewer's token in the Authorization header; text
// from the clusters is only ever set as textContent (names and messages are users' input).
"use strict";

const REFRESH_MS = 5000;
const state = { token: "" };

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

async function api(path) {
  const answer = await fetch(`api/${path}`, {
    headers: { Authorization: `Bearer ${state.token}` }, cache: "no-store",
    credentials: "omit", referrerPolicy: "no-referrer" });
  if (!answer.ok) {
    const text = (await answer.text()).trim();
    throw new Error(`${answer.status}: ${text}`);
  }
  return answer.json();
}

function fill(id, rows, columns, empty) {
  const body = document.querySelector(`#${id} tbody`);
  if (!rows.length) rows = [el("tr", {}, el("td", { colspan: columns }, empty))];
  body.replaceChildren(...rows);
}

function more(id, count, words) {
  document.getElementById(id).textContent = count ? `and ${count} more ${words}` : "";
}

function workerRow(w) {
  const nodes = w.nodes == null ? "unknown"
    : `${w.nodes}${w.cordoned ? ` (${w.cordoned} cordoned)` : ""}`;
  const gpus = w.gpusFree == null ? "unknown" : `${w.gpusFree} of ${w.gpusTotal}`;
  const others = w.resources.map((r) => `${r.resource} ${r.free} of ${r.total}`).join(", ");
  const sent = w.sentByState.map(([s, n]) => `${n} ${s}`).join(", ");
  return el("tr", { "data-cluster": w.name, class: w.reachable ? "" : "down" },
    el("th", { scope: "row" }, w.name), el("td", { class: "why" }, w.answering),
    el("td", { class: "num" }, nodes), el("td", { class: "num" }, gpus),
    el("td", { class: "why" }, others || "-"),
    el("td", {}, !w.sent ? "none" : w.sentByState.length > 1 ? `${w.sent}: ${sent}` : sent));
}

function waitingRow(w) {
  return el("tr", { "data-key": `${w.namespace}/${w.name}` },
    el("td", { class: "num" }, w.position), el("td", {}, `${w.namespace}/${w.name}`),
    el("td", { class: "num" }, w.priority), el("td", { class: "num" }, w.gpus),
    el("td", {}, w.waiting), el("td", { class: "why" }, w.why));
}

function sentRow(s) {
  return el("tr", { "data-key": `${s.namespace}/${s.name}` },
    el("td", {}, `${s.namespace}/${s.name}`), el("td", {}, s.worker), el("td", {}, s.state));
}

async function load() {
  const c = await api("clusters");
  const down = c.workers.filter((w) => !w.reachable).length;
  document.getElementById("clusters-summary").textContent =
    `${c.workers.length} worker clusters, ${down} not answering; ` +
    `${c.waiting.length + c.moreWaiting} waiting, ${c.sent.length + c.moreSent} sent; ` +
    `the manager's last pass ${c.lastPass} ago`;
  fill("workers-table", c.workers.map(workerRow), 6, "No WorkerCluster is registered.");
  fill("waiting-table", c.waiting.map(waitingRow), 6, "Nothing waits in the manager.");
  fill("sent-table", c.sent.map(sentRow), 3, "Nothing is sent.");
  more("waiting-more", c.moreWaiting, "waiting");
  more("sent-more", c.moreSent, "sent");
}

async function refresh() {
  if (!state.token) {
    showProblem("Enter a bearer token to see the clusters.");
    return;
  }
  try {
    await load();
    showProblem("");
  } catch (e) {
    showProblem(e.message);
  }
}

function start() {
  // `kubectl appwrapper dashboard` opens the page with the token in the fragment, which
  // browsers never send: take it, then drop it from the address bar and history.
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.get("token")) {
    sessionStorage.setItem("token", fragment.get("token"));
    history.replaceState(null, "", location.pathname);
  }
  state.token = sessionStorage.getItem("token") || "";
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = document.getElementById("token").value.trim();
    sessionStorage.setItem("token", state.token);
    refresh();
  });
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.clear();
    state.token = "";
    document.getElementById("token").value = "";
    refresh();
  });
  refresh();
  setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", start);
