// NEST playground: streams a chat answer from /v1/chat/completions and shows its citations.
// Offsets from the server count Unicode code points (Python string indices), so text is
// handled as arrays of code points (Array.from), never as UTF-16 string indices.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { chars: [], annotations: new Map(), passages: new Map(), active: null };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function init() {
  $("api-key").value = localStorage.getItem("nest-api-key") || "";
  try {
    const health = await (await fetch("/health")).json();
    $("model").textContent = `model ${health.model} · preset ${health.preset} · ${health.decoding}`;
    for (const name of health.presets || [health.preset]) {
      const opt = document.createElement("option");
      opt.value = opt.textContent = name;
      if (name === health.preset) opt.selected = true;
      $("preset").appendChild(opt);
    }
  } catch (e) {
    showError("cannot reach the server: " + e);
  }
  $("ask").addEventListener("submit", (ev) => { ev.preventDefault(); ask(); });
  $("question").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); ask(); }
  });
  $("answer").addEventListener("mouseover", (ev) => pick(ev.target));
  $("answer").addEventListener("click", (ev) => pick(ev.target));
}

function showError(msg) {
  $("error").textContent = msg;
  $("error").hidden = !msg;
}

async function ask() {
  const question = $("question").value.trim();
  if (!question) { showError("type a question first"); return; }
  localStorage.setItem("nest-api-key", $("api-key").value.trim());
  showError("");
  state.chars = []; state.annotations.clear(); state.active = null;
  render(); resetStats(); resetSource();
  document.body.dataset.state = "streaming";
  $("send").disabled = true;
  const t0 = performance.now();
  let ttft = null;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({
        messages: [{ role: "user", content: question }],
        stream: true,
        max_tokens: parseInt($("max-tokens").value, 10) || 96,
        preset: $("preset").value || undefined,
      }),
    });
    if (!resp.ok) {
      const body = await resp.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || resp.statusText);
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const msg = JSON.parse(data);
          if (msg.error) throw new Error(msg.error.message);
          const choice = (msg.choices || [])[0];
          if (choice && choice.delta) {
            if (choice.delta.content) {
              if (ttft === null) ttft = performance.now() - t0;
              state.chars.push(...Array.from(choice.delta.content));
            }
            for (const a of choice.delta.annotations || []) {
              const u = a.url_citation;
              state.annotations.set(u.passage_id + "|" + u.start_index, u);
            }
            render();
          }
          if (msg.nest) showStats(msg.nest.stats, ttft, performance.now() - t0);
        }
      }
    }
  } catch (e) {
    showError(String(e.message || e));
  } finally {
    $("send").disabled = false;
    document.body.dataset.state = "done";
  }
}

function sortedAnnotations() {
  return [...state.annotations.values()].sort((a, b) => a.start_index - b.start_index);
}

// The answer as plain text with one <mark> per copied span (spans never overlap).
function render() {
  const out = $("answer");
  out.textContent = "";
  let pos = 0;
  sortedAnnotations().forEach((u, i) => {
    const start = Math.max(u.start_index, pos);
    const end = Math.min(u.end_index, state.chars.length);
    if (end <= start) return;
    out.appendChild(document.createTextNode(state.chars.slice(pos, start).join("")));
    const mark = document.createElement("mark");
    mark.className = "cite";
    mark.dataset.key = u.passage_id + "|" + u.start_index;
    mark.appendChild(document.createTextNode(state.chars.slice(start, end).join("")));
    const sup = document.createElement("sup");
    sup.textContent = String(i + 1);
    mark.appendChild(sup);
    if (state.active === mark.dataset.key) mark.classList.add("active");
    out.appendChild(mark);
    pos = end;
  });
  out.appendChild(document.createTextNode(state.chars.slice(pos).join("")));
}

async function pick(target) {
  const mark = target.closest && target.closest("mark.cite");
  if (!mark || mark.dataset.key === state.active) return;
  const u = state.annotations.get(mark.dataset.key);
  if (!u) return;
  state.active = mark.dataset.key;
  document.querySelectorAll("mark.cite.active").forEach((m) => m.classList.remove("active"));
  mark.classList.add("active");
  await showSource(u);
}

async function passage(id) {
  if (!state.passages.has(id)) {
    const resp = await fetch("/v1/passages/" + encodeURIComponent(id), { headers: headers() });
    if (!resp.ok) throw new Error("passage " + id + ": " + resp.statusText);
    state.passages.set(id, await resp.json());
  }
  return state.passages.get(id);
}

// The cited passage with the span marked at its exact offsets.
async function showSource(u) {
  let p;
  try { p = await passage(u.passage_id); } catch (e) { showError(String(e.message || e)); return; }
  if (state.active !== u.passage_id + "|" + u.start_index) return; // the user moved on
  const chars = Array.from(p.text);
  const base = p.char_start;
  const known = u.source_start !== null && base !== null && base !== undefined;
  const a = known ? u.source_start - base : u.passage_start;
  const b = known ? u.source_end - base : u.passage_end;
  const pre = $("source-text");
  pre.textContent = "";
  pre.appendChild(document.createTextNode(chars.slice(0, a).join("")));
  const mark = document.createElement("mark");
  mark.textContent = chars.slice(a, b).join("");
  pre.appendChild(mark);
  pre.appendChild(document.createTextNode(chars.slice(b).join("")));
  const title = $("source-title");
  title.textContent = p.title || u.title || p.doc_id;
  if (p.url) title.href = p.url; else title.removeAttribute("href");
  $("source-meta").textContent =
    `${p.doc_id} · chars ${u.source_start ?? "?"}–${u.source_end ?? "?"} of the source` +
    (p.url ? ` · ${p.url}` : "");
  document.querySelector("#source .hint").hidden = true;
  $("source-body").hidden = false;
  mark.scrollIntoView({ block: "nearest" });
}

function resetSource() {
  document.querySelector("#source .hint").hidden = false;
  $("source-body").hidden = true;
}

function resetStats() {
  for (const id of ["s-attr", "s-tps", "s-fwd", "s-tokens", "s-spans", "s-apv", "s-ttft", "s-time"]) {
    $(id).textContent = "–";
  }
}

function showStats(s, ttft, totalMs) {
  $("s-attr").textContent = (100 * s.attribution_ratio).toFixed(1) + " %";
  $("s-tps").textContent = s.tokens_per_second.toFixed(1);
  $("s-fwd").textContent = `${s.forward_passes} (${(s.forward_passes / Math.max(1, s.new_tokens)).toFixed(2)} per token)`;
  $("s-tokens").textContent = `${s.new_tokens} new, ${s.attributed_tokens} attributed`;
  $("s-spans").textContent = `${state.annotations.size} (mean ${s.mean_span_length.toFixed(1)} tokens)`;
  $("s-apv").textContent = s.accepted_per_verify.toFixed(1);
  $("s-ttft").textContent = ttft === null ? "–" : (ttft / 1000).toFixed(2) + " s";
  $("s-time").textContent = (totalMs / 1000).toFixed(2) + " s";
}

init();
