// Hand-drawn SVG charts with log10 axes (no libraries: the page works offline).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const W = 640, H = 300, L = 70, R = 14, T = 12, B = 34;
const BAND_ABOVE = 40;  // more points than this: the standard error is a band, not bars

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function clear(svg) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
}

function emptyChart(svg, message) {
  svg.appendChild(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle",
                                   class: "empty" }, message || "no finished round yet"));
}

function decadeLabel(e) {
  if (e >= -2 && e <= 3) return String(Number(Math.pow(10, e).toPrecision(1)));
  return "1e" + e;
}

function xTicks(lo, hi, maxTicks) {
  const span = Math.max(1, hi - lo);
  const raw = span / Math.max(1, maxTicks - 1);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = Math.max(1, [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || mag);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) out.push(v);
  return out;
}

const drawable = (v) => v !== null && v !== undefined && v > 0 && isFinite(v);

// The decades [e0, e1] that hold the positive values vs.
function decades(vs) {
  const logs = vs.filter(drawable).map(Math.log10);
  let e0 = Math.floor(Math.min(...logs)), e1 = Math.ceil(Math.max(...logs));
  if (e0 === e1) { e0 -= 1; e1 += 1; }
  return [e0, e1];
}

// A log axis: grid lines and labels at the decades (and 2, 5 between few decades).
// vertical: the y axis (labels on the left); else the x axis (labels below).
function logAxis(svg, e0, e1, at, vertical, format) {
  const label = (e, m) => {
    const v = m * Math.pow(10, e);
    if (format) return format(v);
    return m === 1 ? decadeLabel(e) : String(Number(v.toPrecision(1)));
  };
  const mark = (v, text, cls) => {
    const p = at(v);
    if (vertical) {
      svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: p, y2: p, class: cls }));
      svg.appendChild(svgEl("text", { x: L - 6, y: p + 4, "text-anchor": "end" }, text));
    } else {
      svg.appendChild(svgEl("line", { x1: p, x2: p, y1: T, y2: H - B, class: cls }));
      svg.appendChild(svgEl("text", { x: p, y: H - B + 18, "text-anchor": "middle" }, text));
    }
  };
  const stepE = Math.max(1, Math.ceil((e1 - e0) / 6));
  for (let e = e0; e <= e1; e += stepE) {
    mark(Math.pow(10, e), label(e, 1), "grid");
    if (e1 - e0 <= 2 && e < e1) {  // few decades: minor lines at 2 and 5
      for (const m of [2, 5]) mark(m * Math.pow(10, e), label(e, m), "minor");
    }
  }
}

function frame(svg, xLabel) {
  svg.appendChild(svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  svg.appendChild(svgEl("text", { x: W - R, y: H - 2, "text-anchor": "end" }, xLabel));
}

// A circle for point p of series s; data-value holds the exact value drawn.
function dot(s, p, cx, cy, extra) {
  const c = svgEl("circle", { cx: cx.toFixed(1), cy: cy.toFixed(1), r: s.radius || 3.5,
                              fill: s.color, class: "pt", "data-series": s.key,
                              "data-round": p.round !== undefined ? p.round : p.x,
                              "data-value": p.y, ...(extra || {}) });
  c.appendChild(svgEl("title", {}, p.title));
  return c;
}

// Vertical error bars (few points) or a band (many) from p.lo to p.hi; lo <= 0 is drawn
// down to the chart's floor (log scale).
function spread(g, s, good, px, py, floor) {
  const withSpread = good.filter((p) => drawable(p.hi));
  if (withSpread.length === 0) return;
  const lo = (p) => py(drawable(p.lo) ? Math.max(p.lo, floor) : floor).toFixed(1);
  const hi = (p) => py(p.hi).toFixed(1);
  if (withSpread.length > BAND_ABOVE) {
    const upper = withSpread.map((p) => px(p.x).toFixed(1) + "," + hi(p));
    const lower = withSpread.slice().reverse().map((p) => px(p.x).toFixed(1) + "," + lo(p));
    g.appendChild(svgEl("polygon", { class: "band", fill: s.color,
                                     points: upper.concat(lower).join(" "),
                                     "data-series": s.key }));
  } else {
    for (const p of withSpread) {
      const x = px(p.x).toFixed(1);
      g.appendChild(svgEl("line", { class: "errbar", stroke: s.color, x1: x, x2: x,
                                    y1: lo(p), y2: hi(p), "data-round": p.x }));
    }
  }
}

/**
 * Draw series of (round, value) points on a chart with a log10 y axis.
 * series: [{key, label, color, points: [{x, y, title, lo?, hi?}], dashed?, line?: false,
 *           dots?: false, width?}]; non-positive values are skipped. Points with lo/hi
 * get error bars (or a band when many). opts: {empty, yFormat, hlines: [{y, label, key}]}.
 * Every drawn point is a <circle class="pt" data-series=key data-round=x data-value=y>.
 */
function drawLogChart(svg, series, opts) {
  clear(svg);
  const pts = series.flatMap((s) => s.points.filter((p) => drawable(p.y)));
  if (pts.length === 0) {
    emptyChart(svg, opts.empty);
    return;
  }
  const hlines = (opts.hlines || []).filter((h) => drawable(h.y));
  const xs = pts.map((p) => p.x);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  const [e0, e1] = decades(pts.map((p) => p.y).concat(
    pts.map((p) => p.hi), pts.map((p) => p.lo), hlines.map((h) => h.y)));
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (v) => T + (1 - (Math.log10(v) - e0) / (e1 - e0)) * (H - T - B);
  logAxis(svg, e0, e1, py, true, opts.yFormat);
  for (const x of xTicks(Math.ceil(x0), Math.floor(x1), 8)) {
    svg.appendChild(svgEl("text", { x: px(x), y: H - B + 18, "text-anchor": "middle" }, x));
  }
  frame(svg, "round");
  for (const h of hlines) {
    const y = py(h.y).toFixed(1);
    const g = svgEl("g", { "data-series": h.key, "data-value": h.y, class: "hline" });
    g.appendChild(svgEl("line", { x1: L, x2: W - R, y1: y, y2: y }));
    g.appendChild(svgEl("text", { x: W - R - 4, y: Number(y) - 5, "text-anchor": "end" },
                        h.label));
    svg.appendChild(g);
  }
  for (const s of series) {
    const good = s.points.filter((p) => drawable(p.y)).sort((a, b) => a.x - b.x);
    const g = svgEl("g", { "data-series": s.key });
    spread(g, s, good, px, py, Math.pow(10, e0));
    if (good.length > 1 && s.line !== false) {
      g.appendChild(svgEl("polyline", {
        class: "series", stroke: s.color, "stroke-width": s.width || 2,
        points: good.map((p) => px(p.x).toFixed(1) + "," + py(p.y).toFixed(1)).join(" "),
        "stroke-dasharray": s.dashed ? "5 4" : "none", "data-series": s.key,
      }));
    }
    if (s.dots !== false) for (const p of good) g.appendChild(dot(s, p, px(p.x), py(p.y)));
    svg.appendChild(g);
  }
}

/**
 * A log-log scatter of one series' (x, y) points with the line y = x (calibration).
 * points: [{x, y, round, title, lo?, hi?}]; lo/hi: error bars in y. Every drawn point is a
 * <circle class="pt" data-series=key data-round data-x data-value=y>.
 */
function drawScatter(svg, s, opts) {
  clear(svg);
  const good = s.points.filter((p) => drawable(p.x) && drawable(p.y));
  if (good.length === 0) {
    emptyChart(svg, opts.empty);
    return;
  }
  // one range for both axes, so y = x is the diagonal of the square of decades
  const [e0, e1] = decades(good.flatMap((p) => [p.x, p.y, p.hi, p.lo]));
  const lin = (v, a, b) => a + ((Math.log10(v) - e0) / (e1 - e0)) * (b - a);
  const px = (v) => lin(v, L, W - R);
  const py = (v) => lin(v, H - B, T);
  logAxis(svg, e0, e1, py, true);
  logAxis(svg, e0, e1, px, false);
  frame(svg, opts.xLabel || "");
  svg.appendChild(svgEl("text", { x: L + 6, y: T + 12, "text-anchor": "start" },
                        opts.yLabel || ""));
  const lo = Math.pow(10, e0), hi = Math.pow(10, e1);
  svg.appendChild(svgEl("line", { x1: px(lo), y1: py(lo), x2: px(hi), y2: py(hi),
                                   class: "diagonal", "data-series": "y=x" }));
  const g = svgEl("g", { "data-series": s.key });
  for (const p of good.filter((q) => drawable(q.hi))) {
    const x = px(p.x).toFixed(1);
    g.appendChild(svgEl("line", { class: "errbar", stroke: s.color, x1: x, x2: x,
                                  y1: py(drawable(p.lo) ? Math.max(p.lo, lo) : lo).toFixed(1),
                                  y2: py(p.hi).toFixed(1), "data-round": p.round }));
  }
  for (const p of good) g.appendChild(dot(s, p, px(p.x), py(p.y), { "data-x": p.x }));
  svg.appendChild(g);
}

function drawLegend(el, series) {
  el.textContent = "";
  for (const s of series) {
    const span = document.createElement("span");
    span.style.setProperty("--c", s.color);
    span.textContent = s.label;
    el.appendChild(span);
  }
}
