// The replay player: plays a run's rounds stage by stage in the page, from the payload that
// dropmatch/replay.py writes into data-run. Gradio runs this file as the replay component's
// js_on_load (`element` is the component, `watch` re-runs a callback when its value changes).
// Stages of a round: the drafts appear; the verifier marks each slot in turn (until the first
// rejection, which leaves the rest unchecked); the correction or bonus token lands.
(function () {
  if (window.DMReplay) return;
  const SPEEDS = [0.25, 0.5, 1, 2, 4];
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const show = (s) => s.replace(/\n/g, "⏎\n");
  const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));

  // Every stage of a column, with the virtual time (seconds of the run's own clock) it happens at.
  function stagesOf(column) {
    const stages = [{round: -1, step: "prefill", time: column.prefill_s}];
    let start = column.prefill_s;
    column.rounds.forEach((r, i) => {
      const checks = [];
      for (let j = 0; j < r.drafted.length; j++) {
        checks.push(j);
        if (r.drafted[j].reason === "rejected") break;
      }
      const steps = [{step: "draft"}, ...checks.map((j) => ({step: "check", slot: j})), {step: "land"}];
      const verify = Math.max(r.t_round - r.t_draft, 0);
      steps.forEach((s, k) => {
        const time = k === 0 ? start + r.t_draft : start + r.t_draft + (verify * k) / (steps.length - 1);
        stages.push({round: i, time, ...s});
      });
      start += r.t_round;
    });
    return stages;
  }

  function tokenSpan(text, kind, tip, extra = "") {
    return `<span class="dm-tok dm-${kind}${extra}" tabindex="0" role="button" title="${esc(tip)}" data-tip="${esc(tip)}">${esc(show(text))}</span>`;
  }

  // The committed text before round i (cached: each frame only redraws the current round).
  function prefixes(column, lossyKinds) {
    const out = [];
    let html = column.first === null ? "" : tokenSpan(column.first, "first", "first token, from the prefill call");
    let tokens = 1, calls = 1, emitted = 0, lossy = 0;
    column.rounds.forEach((r, i) => {
      out.push({html, tokens, calls, emitted, lossy, rounds: i});
      r.emitted.forEach((e, j) => {
        const refused = r.drafted[j];  // the rejected draft, struck through just before its correction (as the columns show it)
        if (j === r.accepted && r.extra === "correction" && refused && refused.reason === "rejected") {
          html += tokenSpan(refused.x, "rejected", `round ${r.index}: rejected draft (${refused.verdict}); the correction follows`);
        }
        if (e.x) html += tokenSpan(e.x, e.kind, e.tip);
      });
      tokens += r.emitted.length; calls += 1; emitted += r.emitted.length;
      lossy += r.drafted.filter((d) => lossyKinds.has(d.reason)).length;
    });
    out.push({html, tokens, calls, emitted, lossy, rounds: column.rounds.length});
    return out;
  }

  function slotWhy(d) {
    let why = `draft q = ${fmt(d.q)}; clean target's choice “${esc(show(d.target))}” (p = ${fmt(d.p_target_top)}), this token p = ${fmt(d.p)}`;
    if (d.paths) {
      why += `<br>K paths: ${d.paths.map((t) => `<span class="dm-path${t === d.x ? " dm-path-agrees" : ""}">${esc(show(t))}</span>`).join(" ")}`;
      why += `<br>votes for the draft ${d.votes}/${d.paths.length} (majority needs ${d.needed}); JS = ${fmt(d.js, 4)} vs threshold ${fmt(d.threshold, 4)} (${d.js <= d.threshold ? "within" : "above"})`;
    }
    return why;
  }

  // The column's text and panel at one stage.
  function frame(column, pre, stage) {
    if (stage.step === "prefill") {
      return {text: "", note: "prefill: the target reads the prompt", counts: {tokens: 0, calls: 0, emitted: 0, lossy: 0, rounds: 0}};
    }
    const r = column.rounds[stage.round];
    const base = pre[stage.round];
    if (stage.step === "land") {
      const after = pre[stage.round + 1];
      const extra = r.emitted.length > r.accepted ? `, then the ${r.extra} “${esc(show(r.emitted[r.accepted].x))}”` : "";
      return {text: after.html, counts: after, note: `round ${r.index}: ${r.accepted} of ${r.drafted.length} drafts accepted${extra}`};
    }
    const checked = stage.step === "check" ? stage.slot : -1;
    let pending = "";
    r.drafted.forEach((d, j) => {
      let kind = "pending";
      if (j <= checked) kind = d.reason;
      else if (checked >= 0 && r.drafted[checked].reason === "rejected") kind = "unchecked";
      const tip = `slot ${j + 1}: draft q = ${fmt(d.q)}${j <= checked ? "; " + d.verdict : ""}`;
      pending += tokenSpan(d.x, kind, tip, j === checked ? " dm-now" : " dm-draft");
    });
    let note = `round ${r.index}: ${r.drafted.length} drafted by ${esc(r.drafted_by)}`;
    if (stage.step === "check") {
      const d = r.drafted[checked];
      note = `round ${r.index}, slot ${checked + 1} “${esc(show(d.x))}”: <b>${esc(d.verdict)}</b><br>${slotWhy(d)}`;
    }
    return {text: base.html + pending, counts: base, note};
  }

  function counterHtml(counts, time) {
    const tau = counts.rounds ? (counts.emitted / counts.rounds).toFixed(2) : "–";
    return `<span>tokens <b data-counter="tokens">${counts.tokens}</b></span><span>target calls <b data-counter="calls">${counts.calls}</b></span>` +
      `<span>tau <b data-counter="tau">${tau}</b></span><span>accepted only by the lossy rule <b data-counter="lossy">${counts.lossy}</b></span>` +
      `<span>clock <b data-counter="clock">${time.toFixed(2)} s</b></span>`;
  }

  const CONTROLS = `
    <div class="dm-rp-controls" role="toolbar" aria-label="replay controls">
      <button data-act="play" aria-keyshortcuts="Space">▶ Play</button>
      <button data-act="prev-round" aria-keyshortcuts="Shift+ArrowLeft">« round</button>
      <button data-act="prev" aria-keyshortcuts="ArrowLeft PageUp">◀ stage</button>
      <button data-act="next" aria-keyshortcuts="ArrowRight PageDown">stage ▶</button>
      <button data-act="next-round" aria-keyshortcuts="Shift+ArrowRight">round »</button>
      <button data-act="restart" aria-keyshortcuts="Home">restart</button>
      <label>speed <select data-act="speed">${SPEEDS.map((s) => `<option value="${s}"${s === 1 ? " selected" : ""}>${s}x</option>`).join("")}</select></label>
      <label><input type="checkbox" data-act="step-mode"> one stage per key (presenter)</label>
      <label><input type="checkbox" data-act="predict"> predict each verdict (lesson)</label>
      <button data-act="smaller" aria-label="smaller text">A−</button><button data-act="larger" aria-label="larger text">A+</button>
      <label><input type="checkbox" data-act="contrast"> high contrast</label>
      <button data-act="present" aria-keyshortcuts="F">presenter layout</button>
    </div>
    <div class="dm-rp-keys">Keys: Space play/pause · → or Page Down next stage · ← or Page Up previous stage ·
      Shift+→/← next/previous round · Home restart · + / − text size · F presenter layout (Esc leaves).
      Click or tap a token to pin its numbers. Lesson: the replay stops before each verdict of the lossy
      column; keys 1-5 choose yours.</div>`;

  class Player {
    constructor(host, payload) {
      this.host = host;
      this.payload = payload;
      // the reasons only a lossy rule gives, from the rule table (the payload's legend), not a list kept here
      const lossyKinds = new Set(Object.keys(payload.legend).filter((kind) => payload.legend[kind].lossy));
      this.columns = payload.columns.map((c) => ({data: c, stages: stagesOf(c), pre: prefixes(c, lossyKinds), cursor: 0}));
      this.time = 0; this.speed = 1; this.playing = false; this.font = 1.15; this.last = null;
      // lesson mode: the lossy column's check stages the learner has answered (stage index -> reason)
      this.predict = false; this.answers = new Map(); this.asking = null;
      this.build();
      this.render();
    }
    build() {
      const cols = this.columns.map((c, i) => `
        <section class="dm-rp-col" data-col="${i}" aria-label="${esc(c.data.label)}">
          <h3>${esc(c.data.label)} <span class="dm-rp-done" data-done="${i}"></span></h3>
          <div class="dm-rp-counters" data-counters="${i}"></div>
          <div class="dm-text dm-rp-text" data-text="${i}"></div>
          <div class="dm-rp-note" data-note="${i}" aria-live="polite"></div>
        </section>`).join("");
      const legend = Object.entries(this.payload.legend).filter(([kind]) => kind !== "target")
        .map(([kind, item]) => `<span class="dm-tok dm-${kind}">${esc(item.label)}</span>`).join(" ");
      this.host.innerHTML = `<div class="dm-rp" tabindex="-1"><div class="dm-rp-title">${esc(this.payload.title || "")}</div>${CONTROLS}
        <div class="dm-rp-legend">${legend} <span class="dm-tok dm-pending">drafted, not yet checked</span></div>
        <div class="dm-rp-cols">${cols}</div><div class="dm-pin" data-pin aria-live="polite">Pinned token: none (click or tap a token).</div></div>`;
      this.root = this.host.querySelector(".dm-rp");
      this.root.addEventListener("click", (e) => this.onClick(e));
      this.root.addEventListener("change", (e) => this.onChange(e));
      this.root.addEventListener("keydown", (e) => { if (e.key === "Enter" && e.target.classList.contains("dm-tok")) this.pin(e.target); });
      this.applyFont();
    }
    onClick(e) {
      const token = e.target.closest(".dm-tok");
      if (token) return this.pin(token);
      const choice = e.target.closest("button[data-answer]");
      if (choice) return this.answer(choice.dataset.answer);
      const button = e.target.closest("button[data-act]");
      if (button) this.act(button.dataset.act);
    }
    onChange(e) {
      const act = e.target.dataset.act;
      if (act === "speed") this.speed = Number(e.target.value);
      if (act === "step-mode" && e.target.checked) this.pause();
      if (act === "contrast") this.root.classList.toggle("dm-high-contrast", e.target.checked);
      if (act === "predict") { this.predict = e.target.checked; this.answers.clear(); this.asking = null; this.pause(); this.render(); }
    }
    // Lesson mode: the first check stage of the lossy column in (cursor, upTo] not yet answered, or -1.
    unanswered(upTo) {
      const c = this.columns[this.columns.length - 1];
      for (let k = c.cursor + 1; k <= Math.min(upTo, c.stages.length - 1); k++) {
        if (c.stages[k].step === "check" && !this.answers.has(k)) return k;
      }
      return -1;
    }
    ask(stage) { this.asking = stage; this.pause(); this.render(); }
    answer(reason) {
      if (this.asking === null) return;
      this.answers.set(this.asking, reason);
      const c = this.columns[this.columns.length - 1];
      this.asking = null;
      this.columns.forEach((col) => this.move(col, 1));
      c.cursor = Math.max(c.cursor, [...this.answers.keys()].pop());
      this.render();
    }
    quiz() {  // {right, asked} of the answers given so far
      const c = this.columns[this.columns.length - 1];
      let right = 0;
      this.answers.forEach((reason, k) => { if (this.slotOf(c, k).reason === reason) right += 1; });
      return {right, asked: this.answers.size};
    }
    slotOf(c, k) { const s = c.stages[k]; return c.data.rounds[s.round].drafted[s.slot]; }
    pin(token) {
      this.root.querySelector("[data-pin]").textContent = "Pinned token: " + token.textContent.replace("⏎", "↵") + " — " + token.dataset.tip;
    }
    act(name) {
      const moves = {next: 1, prev: -1};
      if (name === "play") return this.playing ? this.pause() : this.play();
      if (name === "next" && this.predict) {
        const stage = this.unanswered(this.columns[this.columns.length - 1].cursor + 1);
        if (stage >= 0 || this.asking !== null) return this.ask(stage >= 0 ? stage : this.asking);
      }
      if (name in moves) { this.pause(); this.asking = null; this.columns.forEach((c) => this.move(c, moves[name])); return this.render(); }
      if (name === "next-round" || name === "prev-round") { this.pause(); this.columns.forEach((c) => this.jumpRound(c, name === "next-round" ? 1 : -1)); return this.render(); }
      if (name === "restart") { this.pause(); this.time = 0; this.columns.forEach((c) => (c.cursor = 0)); return this.render(); }
      if (name === "larger" || name === "smaller") { this.font = Math.min(3, Math.max(0.8, this.font + (name === "larger" ? 0.15 : -0.15))); return this.applyFont(); }
      if (name === "present") return this.present(!this.root.classList.contains("dm-presenting"));
    }
    present(on) {
      this.root.classList.toggle("dm-presenting", on);
      if (on) { this.font = Math.max(this.font, 1.6); this.root.focus(); } else { this.font = 1.15; }
      this.applyFont();
    }
    applyFont() { this.root.style.setProperty("--dm-rp-font", this.font + "rem"); }
    move(c, delta) { c.cursor = Math.min(c.stages.length - 1, Math.max(0, c.cursor + delta)); this.time = this.stageTime(); }
    jumpRound(c, delta) {
      const round = c.stages[c.cursor].round;
      const target = delta > 0 ? c.stages.findIndex((s) => s.round > round && s.step === "draft")
        : c.stages.findIndex((s) => s.round === Math.max(round - (c.stages[c.cursor].step === "draft" ? 1 : 0), -1));
      c.cursor = target < 0 ? (delta > 0 ? c.stages.length - 1 : 0) : target;
      this.time = this.stageTime();
    }
    stageTime() { return Math.max(...this.columns.map((c) => c.stages[c.cursor].time)); }
    play() {
      if (this.columns.every((c) => c.cursor === c.stages.length - 1)) { this.time = 0; }
      else { this.time = Math.min(...this.columns.map((c) => c.stages[c.cursor].time)); }
      this.playing = true; this.last = null;
      this.root.dataset.playing = "1";  // at once, as pause() clears it: not only at the first frame
      this.root.querySelector("[data-act=step-mode]").checked = false;
      this.root.querySelector("[data-act=play]").textContent = "⏸ Pause";
      const tick = (now) => {
        if (!this.playing) return;
        // at most a quarter second a frame: a tab in the background pauses the frames, not the race
        if (this.last !== null) this.time += (Math.min(now - this.last, 250) / 1000) * this.speed;
        this.last = now;
        const reached = (c) => { let k = 0; while (k + 1 < c.stages.length && c.stages[k + 1].time <= this.time) k++; return k; };
        const lossy = this.columns[this.columns.length - 1];
        const stop = this.predict ? this.unanswered(reached(lossy)) : -1;
        if (stop >= 0) this.time = lossy.stages[stop - 1].time;  // the race stops just before that verdict
        this.columns.forEach((c) => { c.cursor = reached(c); });
        if (stop >= 0) { lossy.cursor = stop - 1; return this.ask(stop); }
        this.render();
        if (this.columns.every((c) => c.cursor === c.stages.length - 1)) return this.pause();
        this.frameRequest = requestAnimationFrame(tick);
      };
      this.frameRequest = requestAnimationFrame(tick);
    }
    pause() {
      this.playing = false;
      if (this.frameRequest) cancelAnimationFrame(this.frameRequest);
      const button = this.root.querySelector("[data-act=play]");
      if (button) button.textContent = "▶ Play";
      if (this.root) this.root.dataset.playing = "0";
    }
    render() {
      this.columns.forEach((c, i) => {
        const stage = c.stages[c.cursor];
        const f = frame(c.data, c.pre, stage);
        const done = c.cursor === c.stages.length - 1;
        const key = i + ":" + c.cursor;
        if (c.shown !== key) {
          this.root.querySelector(`[data-text="${i}"]`).innerHTML = f.text + (done ? "" : '<span class="dm-cursor">▌</span>');
          this.root.querySelector(`[data-note="${i}"]`).innerHTML = f.note;
          c.shown = key;
        }
        const clock = done ? c.data.final.seconds : Math.min(this.time, c.data.final.seconds);
        this.root.querySelector(`[data-counters="${i}"]`).innerHTML = counterHtml(f.counts, clock);
        this.root.querySelector(`[data-done="${i}"]`).textContent = done ? `finished in ${c.data.final.seconds.toFixed(2)} s` : "";
      });
      if (this.predict) this.renderQuiz();
      this.root.dataset.stage = this.columns.map((c) => c.cursor).join(",");
      this.root.dataset.playing = this.playing ? "1" : "0";
    }
    renderQuiz() {  // the question over the lossy column's note, or the verdict against the answer given
      const i = this.columns.length - 1, c = this.columns[i], note = this.root.querySelector(`[data-note="${i}"]`);
      const {right, asked} = this.quiz();
      const tally = `<div class="dm-rp-quiz" data-quiz="${right}/${asked}">your predictions: ${right} of ${asked} right</div>`;
      if (this.asking !== null) {
        const d = this.slotOf(c, this.asking);
        note.innerHTML = tally + `<div data-question>slot ${c.stages[this.asking].slot + 1} “${esc(show(d.x))}” (q = ${fmt(d.q)}): your verdict?<div class="dm-rp-choices">${
          c.data.choices.map((ch, n) => `<button data-answer="${ch.reason}"><kbd>${n + 1}</kbd> ${esc(ch.label)}</button>`).join("")}</div></div>`;
        c.shown = null;
        return;
      }
      const given = this.answers.get(c.cursor);
      const mark = given === undefined ? "" : given === this.slotOf(c, c.cursor).reason ? '<span data-mark="right">✓ you predicted it</span> '
        : `<span data-mark="wrong">✗ you predicted “${esc(c.data.choices.find((ch) => ch.reason === given).label)}”</span> `;
      note.innerHTML = tally + mark + frame(c.data, c.pre, c.stages[c.cursor]).note;
      c.shown = null;
    }
    visible() { return this.host.isConnected && this.host.offsetParent !== null; }
  }

  function onKey(e) {
    const player = window.DMReplay.current;
    if (!player || !player.visible() || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.target.closest && e.target.closest("input, textarea, select, [contenteditable=true]")) return;
    const keys = {" ": "play", ArrowRight: "next", PageDown: "next", ArrowLeft: "prev", PageUp: "prev", Home: "restart",
                  "+": "larger", "=": "larger", "-": "smaller", f: "present", F: "present"};
    const n = Number(e.key);
    if (player.asking !== null && Number.isInteger(n) && n >= 1) {
      const choices = player.columns[player.columns.length - 1].data.choices;
      if (n <= choices.length) { e.preventDefault(); player.answer(choices[n - 1].reason); }
      return;
    }
    let act = keys[e.key];
    if (e.shiftKey && (e.key === "ArrowRight" || e.key === "ArrowLeft")) act = e.key === "ArrowRight" ? "next-round" : "prev-round";
    if (e.key === "Escape" && player.root.classList.contains("dm-presenting")) act = "present";
    if (!act) return;
    if (e.key === " " && e.target.closest && e.target.closest("button")) return; // a focused button's own Space
    e.preventDefault();
    player.act(act);
  }

  window.DMReplay = {
    current: null,
    linked: false,
    mount(component) {
      const host = component.querySelector(".dm-replay");
      if (window.DMReplay.current) window.DMReplay.current.pause();
      if (!host) { window.DMReplay.current = null; return; }
      const player = new Player(host, JSON.parse(host.dataset.run));
      window.DMReplay.current = player;
      const query = new URLSearchParams(window.location.search);
      if (query.get("presenter") === "1") player.present(true);
      if (query.get("run") && query.get("presenter") !== "1" && !window.DMReplay.linked) { window.DMReplay.linked = true; host.scrollIntoView({block: "start"}); }
    },
  };
  document.addEventListener("keydown", onKey);
})();
window.DMReplay.mount(element);
watch("value", () => window.DMReplay.mount(element));
