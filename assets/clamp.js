// A number typed outside a slider's range, or no number at all (letters, an empty box), is set by Gradio without a
// word: say so, in one line under the control, until the next change (the capture phase sees the typed value
// before Gradio clamps it; what a non-number became is read after Gradio's own handler).
if (!window.dmClampNotes) {
  window.dmClampNotes = true;
  const say = (block, text) => {
    let note = block.querySelector('.dm-clamp');
    if (!text) { if (note) note.remove(); return; }
    if (!note) { note = document.createElement('div'); note.className = 'dm-clamp'; note.setAttribute('role', 'status'); block.append(note); }
    note.textContent = text;
  };
  document.addEventListener('change', (e) => {
    const input = e.target;
    if (!(input instanceof HTMLInputElement) || input.type !== 'number' || !input.closest('#settings')) return;
    const block = input.closest('.block') || input.parentElement;
    const typed = input.value, value = Number(typed);
    const min = input.min === '' ? null : Number(input.min), max = input.max === '' ? null : Number(input.max);
    if (typed === '' && min !== null) {
      setTimeout(() => say(block, 'That is not a number (letters or an empty box): it is set to ' + input.value + '.'), 50);
      return;
    }
    let text = '';
    if (min !== null && value < min) text = typed + ' is below the smallest value this setting takes: it is set to ' + min + '.';
    else if (max !== null && value > max) text = typed + ' is above the largest value this setting takes: it is set to ' + max + '.';
    say(block, text);
  }, true);
}
