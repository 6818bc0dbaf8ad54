// The toy head: a vocabulary of 6 tokens, a hidden state h of 8 numbers, a head W (6 x 8), the
// draft's distribution q and K dropout masks (each path's uniform draws against 1 - p, so they follow p), computed live in the page with the project's formulas
// (dropmatch/toy_head.py runs the Python functions on the same inputs; tests/test_toy_head.py
// checks the two agree). Greedy: the smooth distributions are read at T = 1. Gradio runs this file
// as the toy head component's js_on_load (`element` is the component).
(function () {
  if (window.DMToy) return;
  const V = 6, H = 8, TOKENS = ["the", "a", "cat", "dog", "sat", "ran"];
  const RULES = ["lossless", "naive", "js", "majority", "dropmatch", "typical", "fixed_js"];
  const KNOBS = {majority_fraction: 0.8, typical_eps: 0.3, typical_delta: 0.09, fixed_js_threshold: 0.1};
  const TINY64 = 2.2250738585072014e-308, TINY32 = 1.1754943508222875e-38, EPS32 = Math.pow(2, -23);
  const SHIPPED = {"W":[[-1.53,-0.75,-0.65,-1.61,-0.1,-0.61,-0.98,-1.61],[-0.71,0.3,-0.78,-0.25,-0.22,1.69,0.23,0.47],[-0.7,-1.16,0.7,0.2,0.87,0.24,-0.66,0.81],[1.1,-0.18,-2.25,-1.45,0.06,-0.62,-0.8,-0.13],[1.88,-0.07,0.16,-0.77,0.2,0.05,0.15,-0.48],[-0.11,0.29,-0.16,-0.03,2.36,-1.04,1.57,-0.63]],"presets":{"confident":{"h":[-1.49,-2.76,0.91,1.73,0.05,0.57,-0.0,1.5],"q":[0.14,0.72,0.09,0.0,0.0,0.05],"keep":[[1,1,1,1,1,1,1,1],[0,1,1,1,1,1,1,1],[1,1,1,1,0,1,1,1],[0,1,1,0,1,1,1,1],[0,1,1,1,1,1,1,1]],"p":0.1,"draft":0},"majority":{"h":[-0.7,-0.91,-1.84,0.77,0.55,-0.87,0.78,0.12],"q":[0.12,0.02,0.07,0.01,0.03,0.75],"keep":[[1,1,1,1,1,1,0,1],[1,1,1,1,0,0,1,1],[0,1,1,1,1,0,1,1],[1,1,1,1,1,1,1,1],[1,1,1,1,1,1,0,0]],"p":0.2,"draft":3},"flat":{"h":[0.47,-1.51,0.52,-3.83,-2.89,0.33,1.96,2.15],"q":[0.0,0.31,0.36,0.0,0.32,0.01],"keep":[[1,1,1,0,1,1,0,1],[0,0,1,1,1,1,1,1],[1,1,0,0,0,1,1,1],[0,1,1,0,0,1,1,1],[0,0,1,0,1,1,1,0]],"p":0.4,"draft":0}}};

  // ------------------------------------------------ the math (float64; sampling.py, mc_head.py, verifying.py, acceptance.py)
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  function softmax(row) {
    const top = Math.max(...row);
    const e = row.map((x) => Math.exp(x - top));
    const total = sum(e);
    return e.map((x) => x / total);
  }
  const entropy = (pr) => -sum(pr.map((x) => x * Math.log(Math.max(x, TINY64))));
  function jsDivergence(a, b) {  // sampling.js_divergence: H(m) - (H(a) + H(b)) / 2, >= 0
    const m = a.map((x, i) => (x + b[i]) * 0.5);
    return Math.max(entropy(m) - 0.5 * (entropy(a) + entropy(b)), 0);
  }
  function jsAccurate(a, b) {  // sampling.js_divergence_accurate: the log1p form
    const lim = 1 - Math.pow(2, -24);
    const terms = a.map((x, i) => {
      const r = Math.min(Math.max((x - b[i]) / Math.max(x + b[i], TINY32), -lim), lim);
      return x * Math.log1p(r) + b[i] * Math.log1p(-r);
    });
    return Math.max(0.5 * sum(terms), 0);
  }
  const fastJsError = (v) => 32 * EPS32 * (2 + 2 * Math.log(Math.max(v, 2)));
  const topToken = (row) => row.reduce((best, x, i) => (x > row[best] ? i : best), 0);
  const votesNeeded = (k, f) => Math.max(Math.ceil(f * k - 1e-9), Math.floor(k / 2) + 1);
  const matVec = (w, h) => w.map((row) => sum(row.map((x, j) => x * h[j])));

  // Every number the tab shows; the same keys as dropmatch.toy_head.toy_numbers.
  function compute(input) {
    const {W, h, q, keep, p, draft} = input;
    const knobs = Object.assign({}, KNOBS, input.knobs || {});
    const K = keep.length;
    const masked = keep.map((m) => h.map((x, j) => (x * m[j]) / (1 - p)));
    const pathProbs = masked.map((row) => softmax(matVec(W, row)));
    const pathTokens = masked.map((row) => topToken(matVec(W, row)));
    const centroid = K === 1 ? pathProbs[0] : pathProbs[0].map((_, i) => sum(pathProbs.map((row) => row[i])) / K);
    let pathJs = K === 1 ? [0] : pathProbs.map((row) => jsDivergence(row, centroid));
    let threshold = Math.max(...pathJs);
    let jsDraftCentroid = jsDivergence(q, centroid);
    if (Math.abs(jsDraftCentroid - threshold) <= fastJsError(V)) {  // verifying.settle_close_calls
      jsDraftCentroid = jsAccurate(q, centroid);
      threshold = Math.max(...pathProbs.map((row) => jsAccurate(row, centroid)));
    }
    const target = softmax(matVec(W, h));
    const targetToken = topToken(target);
    const perPath = pathTokens.map((t) => pathTokens.filter((u) => u === t).length);
    const topVotes = Math.max(...perPath);
    const atTop = pathTokens.filter((t, k) => perPath[k] === topVotes);
    const majorityToken = Math.min(...atTop) === Math.max(...atTop) ? atTop[0] : -1;
    const draftVotes = pathTokens.filter((t) => t === draft).length;
    const needed = votesNeeded(K, knobs.majority_fraction);
    const jsDraftTarget = jsDivergence(q, target);
    const floor = Math.min(knobs.typical_delta * Math.exp(-entropy(target)), knobs.typical_eps);
    const checks = {  // acceptance.py: each rule's checks in order, the exact test aside
      lossless: [],
      naive: [["naive", draftVotes > 0]],
      js: [["js", jsDraftCentroid <= threshold]],
      majority: [["majority", draft === majorityToken && draftVotes >= needed]],
      typical: [["typical", target[draft] > floor]],
      fixed_js: [["fixed_js", jsDraftTarget <= knobs.fixed_js_threshold]],
    };
    checks.dropmatch = checks.js.concat(checks.majority);
    const verdicts = {};
    RULES.forEach((rule) => {
      const hit = checks[rule].find(([, ok]) => ok);
      verdicts[rule] = draft === targetToken ? "exact" : hit ? hit[0] : "rejected";
    });
    return {masked, path_probs: pathProbs, path_tokens: pathTokens, centroid, path_js: pathJs, threshold,
            js_draft_centroid: jsDraftCentroid, js_draft_target: jsDraftTarget, target_probs: target,
            target_token: targetToken, majority_token: majorityToken, majority_votes: topVotes,
            draft_votes: draftVotes, votes_needed: needed, verdicts};
  }

  // ------------------------------------------------ random heads and masks (a seeded stream, for "new head" / "new masks")
  function stream(seed) {  // mulberry32
    let a = seed >>> 0;
    return () => { a = (a + 0x6d2b79f5) >>> 0; let t = a; t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
  }
  function normal(next) { return Math.sqrt(-2 * Math.log(1 - next())) * Math.cos(2 * Math.PI * next()); }
  const round2 = (x) => Math.round(x * 100) / 100;
  const headOf = (seed) => { const next = stream(seed); return TOKENS.map(() => Array.from({length: H}, () => round2(normal(next)))); };
  // A path keeps h_j where its uniform draw u_j < 1 - p: the draws stay when p moves, so every mask follows p
  // (p = 0 keeps every coordinate: each path is the clean target, as in the engine, and the rules are lossless).
  const drawsOf = (k, next) => Array.from({length: k}, () => Array.from({length: H}, () => next()));
  const keepOf = (draws, p) => draws.map((row) => row.map((u) => (u < 1 - p ? 1 : 0)));
  // Draws that give a shipped preset's masks at its p: a kept coordinate's below 1 - p, a dropped one's above.
  const drawsFor = (keep, p, next) => keep.map((row) => row.map((m) => (m ? next() * (1 - p) : 1 - p + next() * p)));

  function presetState(name) {
    const s = SHIPPED.presets[name];
    const weights = s.q.slice();
    return {W: SHIPPED.W, h: s.h.slice(), qWeights: weights, draws: drawsFor(s.keep, s.p, stream(3)), p: s.p, draft: s.draft, seed: 1, preset: name};
  }
  function inputOf(state) {
    const total = sum(state.qWeights);
    const q = total > 0 ? state.qWeights.map((x) => x / total) : state.qWeights.map(() => 1 / V);
    return {W: state.W, h: state.h, q, keep: keepOf(state.draws, state.p), p: state.p, draft: state.draft};
  }

  // ------------------------------------------------ the view
  const PRESET_LABELS = {confident: "confident head: the paths agree", flat: "flat head: a wide threshold",
                         majority: "wins only by majority"};
  const fmt = (x, d = 3) => Number(x).toFixed(d);
  const bar = (x, cls = "") => `<span class="dm-toy-bar ${cls}"><span style="width:${Math.round(Math.min(Math.max(x, 0), 1) * 100)}%"></span></span>`;
  const REASON_TEXT = {exact: "accepted: the clean target's own choice", js: "accepted by JS", majority: "accepted by majority",
                       naive: "accepted: a path chose it", typical: "accepted by typical acceptance",
                       fixed_js: "accepted by fixed-threshold JS", rejected: "rejected"};

  function slider(name, i, value, min, max, step, label) {
    return `<label class="dm-toy-slider">${label}<input type="range" data-field="${name}" data-i="${i}" min="${min}" max="${max}" step="${step}" value="${value}" aria-label="${label}"><output>${fmt(value, step >= 1 ? 0 : 2)}</output></label>`;
  }

  function controlsHtml(state) {
    const presets = Object.keys(SHIPPED.presets).map((n) => `<button type="button" data-preset="${n}">${PRESET_LABELS[n] || n}</button>`).join("");
    const draft = TOKENS.map((t, i) => `<option value="${i}"${i === state.draft ? " selected" : ""}>${t}</option>`).join("");
    return `<div class="dm-toy-row">${presets}<button type="button" data-act="masks">new masks</button>
      <label>head seed <input type="number" data-field="seed" value="${state.seed}" min="0" step="1" style="width:5em"></label>
      <button type="button" data-act="head">new head</button></div>
      <div class="dm-toy-row">${slider("k", 0, state.draws.length, 1, 16, 1, "K paths")}${slider("p", 0, state.p, 0, 0.9, 0.01, "dropout p")}
      <label>draft token <select data-field="draft">${draft}</select></label></div>
      <details open><summary>hidden state h (8 numbers) and the draft's q (weights, normalised to sum 1)</summary><div class="dm-toy-sliders">
      ${state.h.map((x, j) => slider("h", j, x, -3, 3, 0.01, "h" + (j + 1))).join("")}</div><div class="dm-toy-sliders">
      ${state.qWeights.map((x, i) => slider("q", i, x, 0, 1, 0.01, "q(" + TOKENS[i] + ") weight")).join("")}</div></details>`;
  }

  function outputHtml(state, n) {
    const input = inputOf(state), keep = input.keep;
    const tok = (i) => (i < 0 ? "(tie)" : TOKENS[i]);
    const probsRow = (row, top) => row.map((x, i) => `<td class="${i === top ? "dm-toy-top" : ""}">${fmt(x)}</td>`).join("");
    const head = `<tr><th>row</th><th>mask m (■ kept)</th>${TOKENS.map((t) => `<th>${t}</th>`).join("")}<th>argmax</th><th>JS vs centroid</th></tr>`;
    const paths = n.path_probs.map((row, k) => `<tr data-path="${k}"><td>path ${k + 1}</td><td class="dm-toy-mask">${keep[k].map((m) => (m ? "■" : "□")).join("")}</td>
      ${probsRow(row, n.path_tokens[k])}<td>${tok(n.path_tokens[k])}</td><td>${fmt(n.path_js[k], 4)}</td></tr>`).join("");
    const clean = `<tr><td>clean target</td><td class="dm-toy-mask">■■■■■■■■</td>${probsRow(n.target_probs, n.target_token)}<td>${tok(n.target_token)}</td><td></td></tr>`;
    const centroid = `<tr class="dm-toy-centroid"><td>centroid</td><td>mean of the paths</td>${probsRow(n.centroid, topToken(n.centroid))}<td></td><td>max: ${fmt(n.threshold, 4)}</td></tr>`;
    const draftRow = `<tr><td>draft q</td><td></td>${probsRow(input.q, input.draft)}<td>drafted: ${tok(input.draft)}</td><td>${fmt(n.js_draft_centroid, 4)}</td></tr>`;
    const scale = Math.max(n.threshold, n.js_draft_centroid, 1e-12) * 1.1;
    const votes = TOKENS.map((t, i) => `${t} ${n.path_tokens.filter((u) => u === i).length}`).join(" · ");
    const verdicts = RULES.map((r) => `<tr data-rule="${r}"><td>${r}</td><td><span class="dm-tok dm-${n.verdicts[r]}" data-verdict="${r}">${REASON_TEXT[n.verdicts[r]]}</span></td></tr>`).join("");
    const inputs = n.masked.map((row, k) => `<tr><td>path ${k + 1}</td>${row.map((x) => `<td>${fmt(x, 2)}</td>`).join("")}</tr>`).join("");
    return `<div class="dm-toy-scroll"><table class="dm-toy-table">${head}${clean}${paths}${centroid}${draftRow}</table></div>
      <details class="dm-toy-scroll"><summary>each path's head input h' = h * m / (1 - p)</summary><table class="dm-toy-table">
      <tr><th>row</th>${state.h.map((_, j) => `<th>h${j + 1}</th>`).join("")}</tr><tr><td>h</td>${state.h.map((x) => `<td>${fmt(x, 2)}</td>`).join("")}</tr>${inputs}</table></details>
      <div class="dm-toy-js"><div>JS(q ‖ centroid) ${bar(n.js_draft_centroid / scale, "dm-toy-draft")} ${fmt(n.js_draft_centroid, 4)}</div>
      <div>threshold = max path JS ${bar(n.threshold / scale, "dm-toy-threshold")} ${fmt(n.threshold, 4)}
      (${n.js_draft_centroid <= n.threshold ? "within: JS accepts" : "above: JS rejects"})</div></div>
      <p>Votes: ${votes}. Majority token: ${tok(n.majority_token)} with ${n.majority_votes}; the draft has ${n.draft_votes}, majority needs ${n.votes_needed} of ${keep.length}.</p>
      <table class="dm-toy-verdicts"><tr><th>rule</th><th>verdict on “${tok(input.draft)}”</th></tr>${verdicts}</table>`;
  }

  class Toy {
    constructor(host) {
      this.host = host;
      this.state = presetState("confident");
      this.next = stream(7);
      host.innerHTML = '<div class="dm-toy"><div data-controls></div><div data-out aria-live="polite"></div></div>';
      host.addEventListener("input", (e) => this.onInput(e));
      host.addEventListener("click", (e) => this.onClick(e));
      this.render(true);
    }
    onInput(e) {
      const el = e.target, field = el.dataset.field, i = Number(el.dataset.i), value = Number(el.value);
      if (!field || field === "seed" || !Number.isFinite(value)) return;
      if (field === "h") this.state.h[i] = value;
      if (field === "q") this.state.qWeights[i] = value;
      if (field === "p") this.state.p = Math.min(Math.max(value, 0), 0.9);
      if (field === "draft") this.state.draft = value;
      if (field === "k") this.state.draws = value > this.state.draws.length
        ? this.state.draws.concat(drawsOf(value - this.state.draws.length, this.next)) : this.state.draws.slice(0, value);
      const out = el.parentElement.querySelector("output");
      if (out) out.textContent = fmt(value, field === "k" ? 0 : 2);
      this.render(false);
    }
    onClick(e) {
      const button = e.target.closest("button");
      if (!button) return;
      if (button.dataset.preset) { this.state = presetState(button.dataset.preset); this.render(true); return; }
      if (button.dataset.act === "masks") this.state.draws = drawsOf(this.state.draws.length, this.next);
      if (button.dataset.act === "head") {
        const seed = Math.max(0, Math.floor(Number(this.host.querySelector("[data-field=seed]").value) || 0));
        this.state.seed = seed;
        this.state.W = headOf(seed);
      }
      this.render(false);
    }
    input() { return inputOf(this.state); }
    render(withControls) {
      if (withControls) this.host.querySelector("[data-controls]").innerHTML = controlsHtml(this.state);
      this.numbers = compute(inputOf(this.state));
      this.host.querySelector("[data-out]").innerHTML = outputHtml(this.state, this.numbers);
      this.host.dataset.shownPreset = this.state.preset || "";
    }
  }

  window.DMToy = {
    compute, TOKENS, RULES, KNOBS, presets: () => Object.keys(SHIPPED.presets),
    presetInput: (name) => inputOf(presetState(name)),
    current: null,
    mount(component) {
      const host = component.querySelector(".dm-toy-host");
      if (host && !host.dataset.mounted) { host.dataset.mounted = "1"; window.DMToy.current = new Toy(host); }
    },
  };
})();
window.DMToy.mount(element);
