/* Text that does not collide: after Plotly has drawn a figure, measure where its chart
 * title, axis titles, tick labels and legend landed and move margins until none overlaps
 * (issue 23). Plotly places each of them on its own (a legend below the plot does not know
 * about the x axis title; a long y title overflows a short subplot into the chart title),
 * and their sizes depend on the width and the fonts, so they are measured, not guessed. */

const GAP = 6; // px between a legend and the x axis's labels and title

function union(root, selector) {
  const rs = [...root.querySelectorAll(selector)].map((e) => e.getBoundingClientRect()).filter((r) => r.width > 0 && r.height > 0);
  if (!rs.length) return null;
  return {
    top: Math.min(...rs.map((r) => r.top)), bottom: Math.max(...rs.map((r) => r.bottom)),
    left: Math.min(...rs.map((r) => r.left)), right: Math.max(...rs.map((r) => r.right)),
  };
}

/** The margins that clear the overlaps of `gd` as drawn now; {} when nothing overlaps. */
function clearance(gd) {
  const fl = gd._fullLayout;
  const plot = union(gd, '.nsewdrag');
  if (!fl || !plot) return {};
  const update = {};
  // A legend below the plot goes under the x axis's tick labels and title: at the bottom of
  // the figure ('container' y 0), with a bottom margin that holds both.
  const legend = union(gd, '.legend .bg');
  if (legend && legend.top >= plot.bottom - 1) {
    const xblock = union(gd, '[class^="xtick"] text, [class^="g-x"][class$="title"] text, text[class^="x"][class$="title"]');
    const below = xblock ? xblock.bottom - plot.bottom : 0;
    const need = Math.ceil(below + GAP + (legend.bottom - legend.top) + 4);
    if (legend.top < (xblock ? xblock.bottom : plot.bottom) + GAP - 1 || Math.abs(fl.margin.b - need) > 2) {
      update['margin.b'] = need;
      update['legend.yref'] = 'container';
      update['legend.y'] = 0;
      update['legend.yanchor'] = 'bottom';
    }
  }
  // A y title (or a legend above the plot) that reaches into the chart title: more top margin.
  const size = fl._size || fl.margin; // the margins as drawn, automargin's pushes included
  const title = union(gd, '.gtitle');
  if (title) {
    const above = union(gd, '[class^="g-y"][class$="title"] text, text[class^="y"][class$="title"], .legend .bg');
    if (above && above.top < title.bottom + 2) update['margin.t'] = Math.ceil(size.t + 2 * (title.bottom + 2 - above.top));
  }
  // The left y title that runs into its own tick labels (Plotly places it from the labels'
  // measured width, which can come out a pixel or two short): a larger standoff moves it
  // out of their way (automargin then widens the margin to hold it).
  const ytitle = union(gd, '.g-ytitle text, text.ytitle');
  const yticks = union(gd, '.ytick text');
  if (ytitle && yticks && ytitle.right > yticks.left - 2 && ytitle.left < yticks.right) {
    const standoff = (fl.yaxis && fl.yaxis.title && fl.yaxis.title.standoff) || 0;
    update['yaxis.title.standoff'] = Math.ceil(standoff + (ytitle.right - yticks.left) + 6);
  }
  return update;
}

/**
 * Relayouts `gd` (a drawn Plotly figure) until its texts do not overlap (at most 3 passes:
 * a new margin moves the subplots, so it is measured again), and again after each resize of
 * the window (responsive figures keep their old margins otherwise).
 */
export async function fitText(gd) {
  const Plotly = window.Plotly;
  if (!Plotly || !gd) return;
  for (let pass = 0; pass < 3; pass++) {
    const update = clearance(gd);
    if (!Object.keys(update).length) break;
    gd.ckptFit = { ...(gd.ckptFit || {}), ...update };
    await Plotly.relayout(gd, update);
  }
  if (!gd.dataset.fitText) {
    gd.dataset.fitText = '1';
    let timer = null;
    window.addEventListener('resize', () => {
      clearTimeout(timer);
      timer = setTimeout(() => { if (gd.isConnected && gd._fullLayout) fitText(gd); }, 250);
    });
  }
}

/** `layout` with the margins and legend place `fitText` last chose for the element `id`, so
 * that redrawing a figure with new data does not jump back and forth. */
export function keptFit(id, layout) {
  const gd = document.getElementById(id);
  const fit = gd && gd.ckptFit;
  if (!fit) return layout;
  const out = JSON.parse(JSON.stringify(layout));
  for (const [path, value] of Object.entries(fit)) {
    const keys = path.split('.');
    let node = out;
    for (const k of keys.slice(0, -1)) node = node[k] = { ...(node[k] || {}) };
    node[keys[keys.length - 1]] = value;
  }
  return out;
}

/**
 * Draws the figure `fig` ({data, layout}) into the element `id` and fits its text. Its title
 * goes to the card's heading (the element `<id>-title`, where there is one), where a long
 * one wraps instead of running past the chart's edge; a layout that sets a height sets the
 * element's (a figure taller than its box would spill over what follows it on the page).
 */
export async function drawFitted(id, fig, config) {
  const gd = document.getElementById(id);
  const heading = document.getElementById(`${id}-title`);
  let layout = keptFit(id, fig.layout);
  const title = layout.title && (typeof layout.title === 'string' ? layout.title : layout.title.text);
  if (heading && title) {
    heading.textContent = title;
    layout = { ...layout, title: { text: '' }, margin: { ...layout.margin, t: Math.min(layout.margin?.t ?? 16, 16) } };
  }
  gd.style.height = layout.height ? `${layout.height}px` : '';
  await window.Plotly.react(gd, fig.data, layout, config);
  await fitText(gd);
  return gd;
}
