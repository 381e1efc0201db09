// NEST playground: streams a chat answer from /v1/chat/completions and shows its citations;
// "attribute this text" sends any text to /v1/attributions and shows its verbatim spans, its
// supported sentences (a second colour) and the sentences nothing supports.
// Offsets from the server count Unicode code points (Python string indices), so text is
// handled as arrays of code points (Array.from), never as UTF-16 string indices.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  chars: [], annotations: new Map(), passages: new Map(), active: null,
  attr: { chars: [], annotations: new Map(), unsupported: [] },
};
// Each area's annotations by mark key (what a click on a mark looks up).
const AREAS = { answer: () => state.annotations, attr: () => state.attr.annotations };

function annotationKey(u) {
  return u.passage_id + "|" + u.start_index + "|" + (u.kind || "copy");
}

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
  $("attribute").addEventListener("submit", (ev) => { ev.preventDefault(); attribute(); });
  $("attr-answer").addEventListener("mouseover", (ev) => pick(ev.target));
  $("attr-answer").addEventListener("click", (ev) => pick(ev.target));
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
              state.annotations.set(annotationKey(u), u);
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

// "Attribute this text": POST /v1/attributions, then show the text with its spans.
async function attribute() {
  const text = $("attr-text").value;
  if (!text.trim()) { showError("paste a text to attribute first"); return; }
  localStorage.setItem("nest-api-key", $("api-key").value.trim());
  showError("");
  document.body.dataset.attrState = "running";
  $("attr-send").disabled = true;
  try {
    const question = $("attr-question").value.trim();
    const resp = await fetch("/v1/attributions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({ text, question: question || undefined }),
    });
    const body = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error((body.error && body.error.message) || resp.statusText);
    const a = state.attr;
    a.chars = Array.from(body.text);
    a.annotations.clear();
    for (const ann of body.annotations || []) {
      a.annotations.set(annotationKey(ann.url_citation), ann.url_citation);
    }
    a.unsupported = body.unsupported || [];
    renderInto($("attr-answer"), "attr", a.chars, a.annotations, a.unsupported);
    $("attr-answer").hidden = false;
    const list = $("attr-unsupported");
    list.textContent = "";
    for (const u of a.unsupported) {
      const li = document.createElement("li");
      li.textContent = u.text;
      list.appendChild(li);
    }
    list.hidden = a.unsupported.length === 0;
    $("attr-summary").textContent =
      `${countKind(a.annotations, "support")} supported sentence(s), ` +
      `${countKind(a.annotations, "verbatim") + countKind(a.annotations, "copy")} verbatim ` +
      `span(s), ${a.unsupported.length} unsupported sentence(s)`;
  } catch (e) {
    showError(String(e.message || e));
  } finally {
    $("attr-send").disabled = false;
    document.body.dataset.attrState = "done";
  }
}

function countKind(annotations, kind) {
  return [...annotations.values()].filter((u) => (u.kind || "copy") === kind).length;
}

function byStart(list) {
  return [...list].sort((a, b) => a.start_index - b.start_index || b.end_index - a.end_index);
}

function render() {
  renderInto($("answer"), "answer", state.chars, state.annotations, []);
}

// ``chars`` with one <mark> per citation: sentence-level marks (``mark.support``, and
// ``span.unsupported`` for sentences nothing supports) hold the exact spans (``mark.cite``:
// copied or verbatim) that fall inside them. Marks of one level never overlap (a later one is
// cut to start where the previous ended; an exact span that crosses a sentence edge is drawn
// in pieces). Each citation is numbered once, in answer order.
function renderInto(out, area, chars, annotations, unsupported) {
  out.textContent = "";
  const all = byStart(annotations.values());
  const exact = all.filter((u) => u.kind !== "support");
  const outer = byStart([
    ...all.filter((u) => u.kind === "support").map((u) => ({ ...u, outer: "support" })),
    ...unsupported.map((u) => ({ start_index: u.start_index ?? u.start,
                                 end_index: u.end_index ?? u.end, outer: "unsupported" })),
  ]);
  const numbers = new Map(all.map((u, i) => [annotationKey(u), i + 1]));
  const text = (a, b) => document.createTextNode(chars.slice(a, b).join(""));

  function mark(u, cls) {
    const m = document.createElement("mark");
    m.className = cls;
    m.dataset.key = annotationKey(u);
    m.dataset.area = area;
    if (state.active === area + "|" + m.dataset.key) m.classList.add("active");
    return m;
  }
  const numbered = new Set(); // a span cut by a sentence edge is numbered on its first piece
  function sup(m, u) {
    if (numbered.has(annotationKey(u))) return;
    numbered.add(annotationKey(u));
    const s = document.createElement("sup");
    s.textContent = String(numbers.get(annotationKey(u)));
    m.appendChild(s);
  }
  // The exact spans within [a, b) into ``parent``, plain text between them.
  function exactInto(parent, a, b) {
    let pos = a;
    for (const u of exact) {
      const start = Math.max(u.start_index, pos);
      const end = Math.min(u.end_index, b, chars.length);
      if (end <= start) continue;
      parent.appendChild(text(pos, start));
      const m = mark(u, "cite");
      m.appendChild(text(start, end));
      sup(m, u);
      parent.appendChild(m);
      pos = end;
    }
    if (b > pos) parent.appendChild(text(pos, b));
  }
  let pos = 0;
  for (const o of outer) {
    const start = Math.max(o.start_index, pos);
    const end = Math.min(o.end_index, chars.length);
    if (end <= start) continue;
    exactInto(out, pos, start);
    let box;
    if (o.outer === "support") {
      box = mark(o, "support");
      box.title = `supported (score ${o.score == null ? "?" : Number(o.score).toFixed(2)})`;
    } else {
      box = document.createElement("span");
      box.className = "unsupported";
      box.title = "no passage supports this sentence";
    }
    exactInto(box, start, end);
    if (o.outer === "support") sup(box, o);
    out.appendChild(box);
    pos = end;
  }
  exactInto(out, pos, chars.length);
}

async function pick(target) {
  const mark = target.closest && target.closest("mark.cite, mark.support");
  if (!mark) return;
  const key = mark.dataset.area + "|" + mark.dataset.key;
  if (key === state.active) return;
  const u = AREAS[mark.dataset.area]().get(mark.dataset.key);
  if (!u) return;
  state.active = key;
  document.querySelectorAll("mark.active").forEach((m) => m.classList.remove("active"));
  mark.classList.add("active");
  await showSource(u, key);
}

async function passage(id) {
  if (!state.passages.has(id)) {
    const resp = await fetch("/v1/passages/" + encodeURIComponent(id), { headers: headers() });
    if (!resp.ok) throw new Error("passage " + id + ": " + resp.statusText);
    state.passages.set(id, await resp.json());
  }
  return state.passages.get(id);
}

// The cited passage with the span marked at its exact offsets (for a supported sentence:
// the passage sentence that supports it).
async function showSource(u, key) {
  let p;
  try { p = await passage(u.passage_id); } catch (e) { showError(String(e.message || e)); return; }
  if (state.active !== key) return; // the user moved on
  const chars = Array.from(p.text);
  const base = p.char_start;
  const known = u.source_start !== null && base !== null && base !== undefined;
  const a = known ? u.source_start - base : u.passage_start;
  const b = known ? u.source_end - base : u.passage_end;
  const pre = $("source-text");
  pre.textContent = "";
  pre.appendChild(document.createTextNode(chars.slice(0, a).join("")));
  const mark = document.createElement("mark");
  if (u.kind === "support") mark.className = "support";
  mark.textContent = chars.slice(a, b).join("");
  pre.appendChild(mark);
  pre.appendChild(document.createTextNode(chars.slice(b).join("")));
  const title = $("source-title");
  title.textContent = p.title || u.title || p.doc_id;
  if (p.url) title.href = p.url; else title.removeAttribute("href");
  $("source-meta").textContent =
    `${p.doc_id} · chars ${u.source_start ?? "?"}–${u.source_end ?? "?"} of the source` +
    (u.kind === "support" && u.score != null ? ` · support ${Number(u.score).toFixed(2)}` : "") +
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
