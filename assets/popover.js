// A token's numbers in a popover: hover or keyboard focus shows it, a click or tap pins it (touch has no hover),
// Escape or a click elsewhere closes it. One fact per line, in the page's font size (a projector can read it);
// it opens below the token, or above it near the window's bottom, and never leaves the window.
const pop = () => element.querySelector('.dm-pop');
let pinned = null;
const show = (token) => {
  const box = pop();
  if (!box || !token.dataset.tip) return;
  box.replaceChildren();
  const head = document.createElement('div');
  head.className = 'dm-pop-token';
  head.textContent = token.textContent.replace('\n', '↵');
  box.append(head);
  for (const line of token.dataset.tip.split('\n')) {
    const row = document.createElement('div');
    if (line.startsWith('why: ')) { row.className = 'dm-pop-why'; row.textContent = line.slice(5); }
    else row.textContent = line;
    box.append(row);
  }
  box.hidden = false;
  place(box, token);
};
// Under the token, or above it where the window has no room below; inside the column and the window.
const place = (box, token) => {
  const margin = 6, edge = 4, host = box.offsetParent || element;
  box.style.maxHeight = (window.innerHeight - 2 * edge) + 'px';
  const t = token.getBoundingClientRect(), h = host.getBoundingClientRect();
  const width = box.offsetWidth, height = box.offsetHeight;
  const leftMost = Math.max(0, edge - h.left), rightMost = Math.min(h.width, window.innerWidth - edge - h.left) - width;
  box.style.left = Math.max(leftMost, Math.min(t.left - h.left, rightMost)) + 'px';
  const below = window.innerHeight - edge - (t.bottom + margin), above = t.top - margin - edge;
  let top = height <= below || below >= above ? t.bottom + margin : t.top - margin - height;
  top = Math.max(edge, Math.min(top, window.innerHeight - edge - height));  // a very tall box: inside all the same
  box.style.top = (top - h.top) + 'px';
};
const hide = () => { const box = pop(); if (box) box.hidden = true; };
element.addEventListener('mouseover', (e) => { const t = e.target.closest('.dm-tok'); if (t && !pinned) show(t); });
element.addEventListener('mouseout', (e) => { if (!pinned && e.target.closest('.dm-tok')) hide(); });
element.addEventListener('focusin', (e) => { const t = e.target.closest('.dm-tok'); if (t && !pinned) show(t); });
element.addEventListener('focusout', (e) => { if (!pinned && e.target.closest('.dm-tok')) hide(); });
element.addEventListener('click', (e) => {
  const t = e.target.closest('.dm-tok');
  if (!t) return;
  if (pinned === t) { pinned = null; t.classList.remove('dm-pinned'); hide(); return; }
  if (pinned) pinned.classList.remove('dm-pinned');
  pinned = t; t.classList.add('dm-pinned'); show(t);
});
element.addEventListener('keydown', (e) => {
  const t = e.target.closest('.dm-tok');
  if (t && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); t.click(); }
  if (e.key === 'Escape') { if (pinned) pinned.classList.remove('dm-pinned'); pinned = null; hide(); }
});
document.addEventListener('click', (e) => {
  if (pinned && !element.contains(e.target)) { pinned.classList.remove('dm-pinned'); pinned = null; hide(); }
});
// The switch under a column that hides or shows its struck-through rejected drafts: a class on the column itself
// (Gradio scopes the page's styles under its container, so a class on <body> would match no scoped rule), which
// stays through the column's later runs.
element.addEventListener('click', (e) => {
  const toggle = e.target.closest('.dm-rejected-toggle');
  if (toggle) toggle.setAttribute('aria-pressed', String(element.classList.toggle('dm-hide-rejected')));
});
