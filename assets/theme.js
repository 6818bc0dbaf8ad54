// Charts follow the page's theme and fit their width. Gradio sets `.dark` from the OS or the Hugging Face
// theme; the figures are built server-side in plotly_white, so in a dark page each chart's backgrounds,
// text and grid are switched in place (Plotly.relayout), again whenever a chart is redrawn. On a narrow
// screen a chart whose legend (under the plot) leaves a panel too short grows taller, and a heatmap's
// token labels (annotations named "token") show only where a cell is wide enough for their line.
// Runs as a hidden component's js_on_load (present on every page).
(function () {
  if (window.DMTheme) return;
  window.DMTheme = true;
  const DARK_PAPER = "#0b0f19";
  const MIN_PANEL = 240; // px of height each panel (y axis) keeps, whatever the legend takes
  const TOKEN_LINE = 15; // px a rotated token label needs across
  const isDark = () => document.body.classList.contains("dark") || document.documentElement.classList.contains("dark");
  function colours(dark) {
    return dark
      ? {paper: DARK_PAPER, plot: "#111827", font: "#e5e7eb", grid: "#374151", line: "#9ca3af"}
      : {paper: "#ffffff", plot: "#ffffff", font: "#2a3f5f", grid: "#ebf0f8", line: "#ebf0f8"};
  }
  const axes = (layout, letter) => Object.keys(layout).filter((key) => new RegExp(`^${letter}axis\\d*$`).test(key));
  function themeUpdate(layout) {
    const dark = isDark();
    if (dark === (layout.paper_bgcolor === DARK_PAPER)) return {}; // already in the page's theme
    const c = colours(dark);
    const update = {paper_bgcolor: c.paper, plot_bgcolor: c.plot, "font.color": c.font, "legend.font.color": c.font,
                    "title.font.color": c.font};
    [...axes(layout, "x"), ...axes(layout, "y")].forEach((axis) => {
      update[`${axis}.gridcolor`] = c.grid;
      update[`${axis}.zerolinecolor`] = c.line;
      update[`${axis}.linecolor`] = c.line;
    });
    return update;
  }
  function fitUpdate(chart, layout) {
    const update = {};
    const size = layout._size;
    if (size && layout.height) {  // the plot area each panel needs, from its share of it (its domain)
      const needed = Math.max(...axes(layout, "y").map((axis) => {
        const domain = layout[axis].domain || [0, 1];
        return MIN_PANEL / Math.max(domain[1] - domain[0], 0.05);
      }));
      if (size.h + 4 < needed) update.height = Math.ceil(layout.height + needed - size.h);
    }
    const annotations = layout.annotations || [];
    const cells = chart.data && chart.data[0] && chart.data[0].x ? chart.data[0].x.length : 0;
    if (cells && layout.xaxis && annotations.some((a) => a.name === "token")) {
      const wide = layout.xaxis._length / cells >= TOKEN_LINE;
      annotations.forEach((a, i) => {
        if (a.name === "token" && a.visible !== wide) update[`annotations[${i}].visible`] = wide;
      });
    }
    return update;
  }
  function tidy(chart) {
    const layout = chart._fullLayout;
    if (!window.Plotly || !layout) return;
    const update = {...themeUpdate(layout), ...fitUpdate(chart, layout)};
    if (Object.keys(update).length) window.Plotly.relayout(chart, update);
  }
  let pending = false;
  const tidyAll = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; document.querySelectorAll(".js-plotly-plot").forEach(tidy); });
  };
  new MutationObserver(tidyAll).observe(document.body, {childList: true, subtree: true, attributes: true,
                                                         attributeFilter: ["class"]});
  window.addEventListener("resize", tidyAll);
  tidyAll();
})();
