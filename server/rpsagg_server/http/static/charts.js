// Hand-drawn SVG line charts with a log10 y axis (no libraries: the page works offline).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
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

/**
 * Draw series of (round, value) points on a log-scale chart.
 * series: [{key, label, color, points: [{x, y, title}]}]; non-positive values are skipped.
 * Every drawn point is a <circle class="pt" data-series=key data-round=x>.
 */
function drawLogChart(svg, series, opts) {
  const W = 640, H = 300, L = 70, R = 14, T = 12, B = 34;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const pts = series.flatMap((s) => s.points.filter((p) => p.y > 0 && isFinite(p.y)));
  if (pts.length === 0) {
    svg.appendChild(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle",
                                     class: "empty" }, opts.empty || "no finished round yet"));
    return;
  }
  const xs = pts.map((p) => p.x), ys = pts.map((p) => Math.log10(p.y));
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  let e0 = Math.floor(Math.min(...ys)), e1 = Math.ceil(Math.max(...ys));
  if (e0 === e1) { e0 -= 1; e1 += 1; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (v) => T + (1 - (Math.log10(v) - e0) / (e1 - e0)) * (H - T - B);
  const fmt = (e, m) => {
    const v = m * Math.pow(10, e);
    if (opts.yFormat) return opts.yFormat(v);
    return m === 1 ? decadeLabel(e) : String(Number(v.toPrecision(1)));
  };
  const stepE = Math.max(1, Math.ceil((e1 - e0) / 6));
  for (let e = e0; e <= e1; e += stepE) {
    const y = py(Math.pow(10, e));
    svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: y, y2: y, class: "grid" }));
    svg.appendChild(svgEl("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, fmt(e, 1)));
    if (e1 - e0 <= 2 && e < e1) {  // few decades: minor lines at 2 and 5
      for (const m of [2, 5]) {
        const ym = py(m * Math.pow(10, e));
        svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: ym, y2: ym, class: "minor" }));
        svg.appendChild(svgEl("text", { x: L - 6, y: ym + 4, "text-anchor": "end" }, fmt(e, m)));
      }
    }
  }
  for (const x of xTicks(Math.ceil(x0), Math.floor(x1), 8)) {
    svg.appendChild(svgEl("text", { x: px(x), y: H - B + 18, "text-anchor": "middle" }, x));
  }
  svg.appendChild(svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  svg.appendChild(svgEl("text", { x: W - R, y: H - 2, "text-anchor": "end" }, "round"));
  for (const s of series) {
    const good = s.points.filter((p) => p.y > 0 && isFinite(p.y)).sort((a, b) => a.x - b.x);
    const g = svgEl("g", { "data-series": s.key });
    if (good.length > 1) {
      g.appendChild(svgEl("polyline", {
        class: "series", stroke: s.color,
        points: good.map((p) => px(p.x).toFixed(1) + "," + py(p.y).toFixed(1)).join(" "),
        "stroke-dasharray": s.dashed ? "5 4" : "none",
      }));
    }
    for (const p of good) {
      const c = svgEl("circle", { cx: px(p.x).toFixed(1), cy: py(p.y).toFixed(1), r: 3.5,
                                  fill: s.color, class: "pt", "data-series": s.key,
                                  "data-round": p.x });
      c.appendChild(svgEl("title", {}, p.title));
      g.appendChild(c);
    }
    svg.appendChild(g);
  }
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
