// The lesson player: predict each judged slot's verdict under the run's rule, then the reveal (the
// exact test first, then the paths), a score, a streak and, at the end, the confusions by reason. The
// payload comes from dropmatch/lessons.py (lessons_html); dropmatch.lessons.score is the reference the
// browser test checks this page's score against. Progress is kept in the browser (localStorage): a
// reload resumes at the same slot. Keys: 1-5 answer, Enter or → next, ← back. Gradio runs this file as
// the lessons component's js_on_load (`element` is the component, `watch` re-runs on a new value).
(function () {
  if (window.DMLessons) return;
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const show = (s) => esc(String(s).replace(/\n/g, "⏎"));
  const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));

  function keyOf(lesson) {  // a short fingerprint of a lesson: its progress is kept under it
    const text = lesson.title + "|" + lesson.rule + "|" + lesson.slots.map((s) => (s.run || 0) + "." + s.round + "." + s.slot + s.x).join(",");
    let h = 2166136261;
    for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619) >>> 0;
    return "dm-lesson:" + h.toString(16);
  }

  // The same groups, order and counts as dropmatch.lessons.score.
  function score(lesson, answers) {
    let right = 0, streak = 0, best = 0;
    const wrong = new Map();
    answers.forEach((answer, i) => {
      const slot = lesson.slots[i];
      if (answer === slot.answer) { right += 1; streak += 1; best = Math.max(best, streak); return; }
      streak = 0;
      const key = answer + "\u0000" + slot.answer;
      if (!wrong.has(key)) wrong.set(key, {answered: answer, truth: slot.answer, slots: []});
      wrong.get(key).slots.push(slot);
    });
    const confusions = [...wrong.values()].map((c) => ({answered: c.answered, truth: c.truth, count: c.slots.length, sentence: sentence(lesson, c)}));
    const cmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
    confusions.sort((a, b) => b.count - a.count || cmp(a.answered, b.answered) || cmp(a.truth, b.truth));
    return {right, asked: answers.length, best_streak: best, streak, confusions};
  }

  function sentence(lesson, c) {
    const label = (r) => lesson.labels[r] || r;
    const n = c.slots.length;
    const head = `you chose “${label(c.answered)}” for ${n} slot${n > 1 ? "s" : ""} that the rule marked “${label(c.truth)}”`;
    const ratios = c.slots.filter((s) => s.js !== undefined && s.threshold).map((s) => s.js / s.threshold);
    if ((c.answered === "js" || c.truth === "js") && ratios.length) {
      const lo = Math.min(...ratios), hi = Math.max(...ratios);
      return `${head}: their JS was ${hi - lo < 0.05 ? lo.toPrecision(2) : lo.toPrecision(2) + "-" + hi.toPrecision(2)}x the threshold (JS accepts at 1x or less)`;
    }
    if ((c.answered === "majority" || c.truth === "majority") && c.slots.every((s) => s.votes !== undefined)) {
      return `${head}: the draft had ${[...new Set(c.slots.map((s) => s.votes))].sort().join("/")} of ${c.slots[0].paths.length} path votes`;
    }
    if ((c.answered === "exact" || c.truth === "exact") && lesson.greedy === false) {
      const odds = c.slots.map((s) => (s.q > 0 ? Math.min(1, s.p / s.q) : 1)), lo = Math.min(...odds), hi = Math.max(...odds);
      return `${head}: the coin accepted them with probability min(1, p / q) = ${hi - lo < 0.005 ? lo.toFixed(2) : lo.toFixed(2) + "-" + hi.toFixed(2)}`;
    }
    if (c.answered === "exact" || c.truth === "exact") return `${head}: the exact test accepts only the clean target's own top token`;
    return head;
  }

  const OPEN_KEY = "dm-lesson:open";  // the lesson last opened, by id: a reload opens it again

  function firstLesson(lessons) {  // ?lesson=NAME, else the one last opened, else the first
    const asked = new URLSearchParams(window.location.search).get("lesson");
    let last = null;
    try { last = localStorage.getItem(OPEN_KEY); } catch (err) { last = null; }
    for (const id of [asked, last]) {
      const i = lessons.findIndex((l) => id && l.id === id);
      if (i >= 0) return i;
    }
    return 0;
  }

  class Player {
    constructor(host, lessons) {
      this.host = host; this.lessons = lessons;
      const button = (l, i) => `<button type="button" data-lesson="${i}">${esc(l.title)} (${l.slots.length})</button>`;
      const group = (name, picked) => (picked.length ? `<div class="dm-ls-pick" role="group" aria-label="${name}"><span>${name}:</span>${picked.join("")}</div>` : "");
      const builtIn = lessons.map((l, i) => (l.intro ? button(l, i) : "")).filter(Boolean);
      const ofRun = lessons.map((l, i) => (l.intro ? "" : button(l, i))).filter(Boolean);
      host.innerHTML = `<div class="dm-ls" tabindex="0">${group("Built-in lessons", builtIn)}${group("Make a lesson from this run", ofRun)}
        <div class="dm-ls-tools"><button type="button" data-act="sheet">printable sheet</button></div><div data-body></div></div>`;
      host.addEventListener("click", (e) => this.onClick(e));
      this.open(firstLesson(lessons));
      const asked = new URLSearchParams(window.location.search).get("lesson");
      if (asked && this.lesson.id === asked) {  // a shared link: its first question in view, without scrolling
        requestAnimationFrame(() => host.scrollIntoView({block: "start"}));
      }
    }
    open(i) {
      this.index = i; this.lesson = this.lessons[i]; this.key = keyOf(this.lesson);
      try { if (this.lesson.id) localStorage.setItem(OPEN_KEY, this.lesson.id); } catch (err) { /* private mode */ }
      let saved = null;
      try { saved = JSON.parse(localStorage.getItem(this.key) || "null"); } catch (err) { saved = null; }
      this.answers = saved && Array.isArray(saved.answers) ? saved.answers.slice(0, this.lesson.slots.length) : [];
      this.slot = saved && Number.isInteger(saved.slot) ? Math.min(saved.slot, this.lesson.slots.length) : 0;
      this.stage = this.answers.length > this.slot ? "verdict" : "ask";
      this.render();
    }
    save() { try { localStorage.setItem(this.key, JSON.stringify({answers: this.answers, slot: this.slot})); } catch (err) { /* private mode */ } }
    answer(choice) {
      if (this.stage !== "ask" || this.slot >= this.lesson.slots.length) return;
      this.answers[this.slot] = choice;
      const s = this.lesson.slots[this.slot];
      this.stage = s.answer === "exact" || this.lesson.rule === "lossless" || !s.paths ? "verdict" : "exact";
      this.save(); this.render();
    }
    next() {
      if (this.stage === "ask") return;
      if (this.stage === "exact") { this.stage = "verdict"; this.render(); return; }
      this.slot = Math.min(this.slot + 1, this.lesson.slots.length);
      this.stage = this.answers.length > this.slot ? "verdict" : "ask";
      this.save(); this.render();
    }
    back() {
      if (this.slot === 0) return;
      this.slot -= 1; this.stage = "verdict"; this.save(); this.render();
    }
    restart() { this.answers = []; this.slot = 0; this.stage = "ask"; this.save(); this.render(); }
    onClick(e) {
      const b = e.target.closest("button");
      if (!b) return;
      if (b.dataset.lesson) this.open(Number(b.dataset.lesson));
      else if (b.dataset.choice) this.answer(b.dataset.choice);
      else if (b.dataset.act === "next") this.next();
      else if (b.dataset.act === "back") this.back();
      else if (b.dataset.act === "restart") this.restart();
      else if (b.dataset.act === "csv") this.csv();
      else if (b.dataset.act === "sheet") this.sheet();
    }
    csv() {
      const rows = [["slot", "rule", "answer", "right answer", "reason"]];
      this.answers.forEach((a, i) => rows.push([i + 1, this.lesson.rule, a, this.lesson.slots[i].answer, this.lesson.slots[i].why]));
      const text = rows.map((r) => r.map((v) => `"${String(v).replace(/"/g, '""')}"`).join(",")).join("\n") + "\n";
      const link = document.createElement("a");
      link.href = URL.createObjectURL(new Blob([text], {type: "text/csv"}));
      link.download = "lesson_results.csv"; link.click();
    }
    sheet() {  // the printable sheet in a new tab, which opens the print dialog
      const url = URL.createObjectURL(new Blob([sheetHtml(this.lesson)], {type: "text/html"}));
      window.open(url, "_blank");
    }
    render() {
      const L = this.lesson, result = score(L, this.answers.slice(0, Math.min(this.answers.length, L.slots.length)));
      const root = this.host.querySelector(".dm-ls");
      root.dataset.slot = String(this.slot); root.dataset.stage = this.stage; root.dataset.right = String(result.right);
      const intro = L.intro ? `<p class="dm-ls-intro" data-intro>${esc(L.intro)}</p>` : "";
      const head = intro + `<div class="dm-ls-score">score <b data-score>${result.right}</b> of ${result.asked} · streak ${result.streak} · best ${result.best_streak}</div>`;
      const body = this.slot >= L.slots.length ? this.summary(result) : this.question(L.slots[this.slot]);
      this.host.querySelector("[data-body]").innerHTML = head + body;
      this.host.querySelectorAll("[data-lesson]").forEach((b) => b.setAttribute("aria-pressed", String(Number(b.dataset.lesson) === this.index)));
    }
    question(s) {
      const L = this.lesson, given = this.answers[this.slot];
      const top = s.target_top.map(([t, p]) => `“${show(t)}” ${fmt(p)}`).join(", ");
      let html = `<h3>Slot ${this.slot + 1} of ${L.slots.length} · rule: ${esc(L.rule)}</h3>${promptLine(L, s)}
        <div class="dm-ls-context">…${show(s.context)}<span class="dm-tok dm-pending">${show(s.x)}</span></div>
        <p>drafted “${show(s.x)}” with q = ${fmt(s.q)}${s.source === "ngram" ? " (prompt lookup: one-hot q)" : ""}; the clean target's top tokens: ${top}</p>`;
      if (this.stage === "ask") {
        return html + `<div class="dm-ls-choices" role="group" aria-label="your verdict">${L.choices.map((c, i) =>
          `<button type="button" data-choice="${c}"><kbd>${i + 1}</kbd> ${esc(L.labels[c] || c)}</button>`).join("")}</div>
          <p class="dm-ls-keys">Keys: 1-${L.choices.length} answer · Enter or → next · ← back</p>`;
      }
      const isTop = s.x === s.target;
      html += `<p data-reveal="exact">Exact test: the target's top token is “${show(s.target)}” (p = ${fmt(s.p_target_top)}); the draft ${isTop ? "is" : "is not"} it.</p>`;
      if (this.stage === "verdict" && s.paths) {
        const scale = Math.max(s.js, s.threshold, 1e-12) * 1.1;
        html += `<p data-reveal="paths">K paths: ${s.paths.map((t) => `<span class="dm-path${t === s.x ? " dm-path-agrees" : ""}">${show(t)}</span>`).join(" ")} · votes for the draft ${s.votes}/${s.paths.length}</p>
          <div>JS ${bar(s.js / scale, "dm-toy-draft")} ${fmt(s.js, 4)} · threshold ${bar(s.threshold / scale, "dm-toy-threshold")} ${fmt(s.threshold, 4)}</div>`;
      }
      if (this.stage === "verdict" && (s.tags || []).length) {
        html += `<p class="dm-ls-close">${s.tags.map((t) => `<span class="dm-ls-tag" data-tag="${esc(t)}">${esc((L.close_calls || {})[t] || t)}</span>`).join(" ")}</p>`;
      }
      if (this.stage === "verdict") {
        const ok = given === s.answer;
        html += `<p class="dm-ls-verdict" data-verdict="${s.answer}"><span class="dm-tok dm-${s.answer}">${esc(L.labels[s.answer] || s.answer)}</span>
          ${ok ? "✓ right" : `✗ you chose “${esc(L.labels[given] || given)}”`}</p><p class="dm-ls-why">${esc(s.why)}</p>`;
      }
      return html + `<div class="dm-ls-choices"><button type="button" data-act="back">← back</button><button type="button" data-act="next">${this.stage === "exact" ? "show the paths" : "next slot"} →</button></div>`;
    }
    summary(result) {
      const rows = result.confusions.map((c) => `<tr data-confusion="${c.answered}|${c.truth}|${c.count}"><td>${esc(c.answered)}</td><td>${esc(c.truth)}</td><td>${c.count}</td><td>${esc(c.sentence)}</td></tr>`).join("");
      return `<h3 data-finished>Finished: ${result.right} of ${result.asked} right, best streak ${result.best_streak}</h3>
        ${rows ? `<table class="dm-toy-table dm-ls-confusions"><tr><th>you chose</th><th>the rule gave</th><th>slots</th><th>what they had in common</th></tr>${rows}</table>` : "<p>No confusions: every verdict right.</p>"}
        <div class="dm-ls-choices"><button type="button" data-act="back">← back</button><button type="button" data-act="csv">results as CSV</button><button type="button" data-act="restart">start again</button></div>`;
    }
  }
  // The printable sheet: every slot without its answer (tick boxes for the choices), then the answer key
  // on a page of its own. A whole HTML document, so that printing it prints nothing of the app.
  function sheetHtml(L) {
    const top = (s) => s.target_top.map(([t, p]) => `“${show(t)}” ${fmt(p, 2)}`).join(", ");
    const slots = L.slots.map((s, i) => `<section class="slot"><h2>${i + 1}.</h2>
      ${promptLine(L, s)}<p class="context">…${show(s.context)}<b class="x">${show(s.x)}</b></p>
      <p>drafted “${show(s.x)}” with q = ${fmt(s.q)}${s.source === "ngram" ? " (prompt lookup: one-hot q)" : ""}; the clean target's top tokens: ${top(s)}</p>
      <p class="choices">${L.choices.map((c) => `<span>☐ ${esc(L.labels[c] || c)}</span>`).join(" ")}</p></section>`).join("");
    const key = L.slots.map((s, i) => `<tr><td>${i + 1}</td><td>${esc(L.labels[s.answer] || s.answer)}</td><td>${esc(s.why)}</td></tr>`).join("");
    return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${esc(L.title)}: lesson sheet</title><style>
      body { font: 11pt/1.45 system-ui, sans-serif; color: #000; background: #fff; margin: 1.5cm; }
      h1 { font-size: 16pt; margin: 0 0 4pt; } h2 { font-size: 11pt; margin: 0; display: inline; }
      .slot { border: 1px solid #888; border-radius: 4pt; padding: 6pt 8pt; margin: 6pt 0; break-inside: avoid; }
      .context { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 10pt; margin: 2pt 0; }
      .x { border: 1.5px dashed #000; padding: 0 2pt; } .choices span { margin-right: 14pt; white-space: nowrap; }
      .key { break-before: page; } table { border-collapse: collapse; width: 100%; }
      td, th { border: 1px solid #888; padding: 3pt 5pt; text-align: left; vertical-align: top; font-size: 10pt; }
      @page { margin: 1.2cm; } @media print { body { margin: 0; } }
    </style></head><body onload="if (!navigator.webdriver) window.print()">
      <h1>${esc(L.title)}</h1>${L.intro ? `<p>${esc(L.intro)}</p>` : ""}
      <p>For each drafted token, tick the verdict the rule gives. Name: ____________________</p>${slots}
      <section class="key"><h1>Answer key: ${esc(L.title)}</h1><table><tr><th>slot</th><th>verdict</th><th>why</th></tr>${key}</table></section>
    </body></html>`;
  }

  function promptLine(L, s) {  // the prompt of the slot's run, its end where it is long
    const prompt = (L.prompts || [])[s.run || 0];
    if (!prompt) return "";
    const shown = prompt.length > 160 ? "…" + prompt.slice(-157) : prompt;
    return `<p class="dm-ls-prompt">prompt: “${show(shown)}”</p>`;
  }

  const bar = (x, cls) => `<span class="dm-toy-bar ${cls}"><span style="width:${Math.round(Math.min(Math.max(x, 0), 1) * 100)}%"></span></span>`;

  function onKey(e) {
    const player = window.DMLessons.current;
    if (!player || !player.host.isConnected || player.host.offsetParent === null || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.target.closest && e.target.closest("input, textarea, select, [contenteditable=true]")) return;
    const n = Number(e.key);
    if (Number.isInteger(n) && n >= 1 && n <= player.lesson.choices.length) { e.preventDefault(); player.answer(player.lesson.choices[n - 1]); return; }
    if (e.key === "Enter" && e.target.closest && e.target.closest(".dm-ls button")) return;  // its focused button clicks itself
    if (e.key === "Enter" || e.key === "ArrowRight" || e.key === "PageDown") { e.preventDefault(); player.next(); }
    if (e.key === "ArrowLeft" || e.key === "PageUp") { e.preventDefault(); player.back(); }
  }

  window.DMLessons = {
    current: null, score, sheetHtml,
    mount(component) {
      const host = component.querySelector(".dm-lesson");
      if (!host) { window.DMLessons.current = null; return; }
      window.DMLessons.current = new Player(host, JSON.parse(host.dataset.lessons));
    },
  };
  document.addEventListener("keydown", onKey);
})();
window.DMLessons.mount(element);
watch("value", () => window.DMLessons.mount(element));
