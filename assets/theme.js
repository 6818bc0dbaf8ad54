// Charts follow the page's theme. Gradio sets `.dark` from the OS or the Hugging Face theme; the
// figures are built server-side in plotly_white, so in a dark page each chart's backgrounds, text
// and grid are switched in place (Plotly.relayout), again whenever a chart is redrawn.
// Runs as the legend component's js_on_load (present on every page).
(function () {
  if (window.DMTheme) return;
  window.DMTheme = true;
  const DARK_PAPER = "#0b0f19";
  const isDark = () => document.body.classList.contains("dark") || document.documentElement.classList.contains("dark");
  function colours(dark) {
    return dark
      ? {paper: DARK_PAPER, plot: "#111827", font: "#e5e7eb", grid: "#374151", line: "#9ca3af"}
      : {paper: "#ffffff", plot: "#ffffff", font: "#2a3f5f", grid: "#ebf0f8", line: "#ebf0f8"};
  }
  function paint(chart) {
    const layout = chart._fullLayout;
    if (!window.Plotly || !layout) return;
    const dark = isDark();
    if (dark === (layout.paper_bgcolor === DARK_PAPER)) return; // already in the page's theme
    const c = colours(dark);
    const update = {paper_bgcolor: c.paper, plot_bgcolor: c.plot, "font.color": c.font, "legend.font.color": c.font,
                    "title.font.color": c.font};
    Object.keys(layout).filter((key) => /^[xy]axis\d*$/.test(key)).forEach((axis) => {
      update[`${axis}.gridcolor`] = c.grid;
      update[`${axis}.zerolinecolor`] = c.line;
      update[`${axis}.linecolor`] = c.line;
    });
    window.Plotly.relayout(chart, update);
  }
  let pending = false;
  const paintAll = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; document.querySelectorAll(".js-plotly-plot").forEach(paint); });
  };
  new MutationObserver(paintAll).observe(document.body, {childList: true, subtree: true, attributes: true,
                                                          attributeFilter: ["class"]});
  paintAll();
})();
