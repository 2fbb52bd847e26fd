// kiln view: draws the graph(s) in the page's JSON (script#kiln-data).
//
// The layout is a small layered (Sugiyama-style) layout written here rather
// than a graph library: the page must open offline with nothing fetched, no
// vendored library is allowed unless Debian packages it, and the graphs are
// DAGs already in execution order, so the textbook steps stay short:
//   1. layers: longest path from the sources (one pass in node order);
//   2. dummy nodes on edges spanning several layers (very long ones, such as a
//      mask read by every block, are drawn straight and left out of ordering);
//   3. order within layers: barycenter sweeps, down then up;
//   4. x: each layer pulled towards its neighbours' centres, order and spacing
//      kept by isotonic regression (pool-adjacent-violators), y by layer.
// A delegate region is a compound node: collapsed it is one block; expanded,
// its backend nodes are laid out the same way inside it and the block takes
// their size in the outer layout.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("kiln-data").textContent);
  var SVGNS = "http://www.w3.org/2000/svg";
  var NODE_H = 26, RANK_GAP = 34, NODE_GAP = 14, PAD = 14, HEAD = 24, MAX_SPAN = 60;

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }
  function el(tag, attrs, html) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (html !== undefined) e.innerHTML = html;
    return e;
  }
  function shapeText(t) { return (t.dtype || "?") + "[" + (t.shape || []).join(", ") + "]"; }
  function fmtMs(ms) { return ms >= 1 ? ms.toFixed(2) + " ms" : (ms * 1000).toFixed(1) + " µs"; }

  // ---------- layered layout of one level ----------
  // ids: node indices of this level, in execution order; edges: [from, to] among them;
  // size(i) -> [w, h]. Returns {pos: {i: [x, y]}, w, h, routes: [[from, to, points]]}.
  function layout(ids, edges, size) {
    var n = ids.length, local = {}, i, e;
    for (i = 0; i < n; i++) local[ids[i]] = i;
    var rank = new Array(n).fill(0), preds = [], k;
    for (i = 0; i < n; i++) preds.push([]);
    var es = [];
    for (k = 0; k < edges.length; k++) {
      var a = local[edges[k][0]], b = local[edges[k][1]];
      if (a === undefined || b === undefined || a === b) continue;
      if (a > b) { var t = a; a = b; b = t; }  // execution order is topological
      es.push([a, b]);
      preds[b].push(a);
    }
    for (i = 0; i < n; i++) for (k = 0; k < preds[i].length; k++) rank[i] = Math.max(rank[i], rank[preds[i][k]] + 1);
    var maxRank = 0;
    for (i = 0; i < n; i++) maxRank = Math.max(maxRank, rank[i]);
    // virtual nodes: real ones, then dummies
    var vw = [], vh = [], vrank = [], up = [], down = [];
    for (i = 0; i < n; i++) {
      var s = size(ids[i]);
      vw.push(s[0]); vh.push(s[1]); vrank.push(rank[i]); up.push([]); down.push([]);
    }
    var routes = [];
    for (k = 0; k < es.length; k++) {
      var u = es[k][0], v = es[k][1], span = rank[v] - rank[u];
      var chain = [u];
      if (span > 1 && span <= MAX_SPAN) {
        for (var r = rank[u] + 1; r < rank[v]; r++) {
          vw.push(0); vh.push(0); vrank.push(r); up.push([]); down.push([]);
          chain.push(vw.length - 1);
        }
      }
      chain.push(v);
      if (span <= MAX_SPAN)
        for (var c = 0; c + 1 < chain.length; c++) { down[chain[c]].push(chain[c + 1]); up[chain[c + 1]].push(chain[c]); }
      routes.push([ids[u], ids[v], chain]);
    }
    var layers = [];
    for (i = 0; i <= maxRank; i++) layers.push([]);
    for (i = 0; i < vw.length; i++) layers[vrank[i]].push(i);
    var order = new Array(vw.length);
    function renumber(L) { for (var j = 0; j < L.length; j++) order[L[j]] = j; }
    layers.forEach(renumber);
    function sweep(L, nb) {
      var bc = {};
      for (var j = 0; j < L.length; j++) {
        var x = L[j], ns = nb[x];
        if (!ns.length) { bc[x] = order[x]; continue; }
        var sum = 0;
        for (var q = 0; q < ns.length; q++) sum += order[ns[q]];
        bc[x] = sum / ns.length;
      }
      L.sort(function (p, q) { return bc[p] - bc[q] || order[p] - order[q]; });
      renumber(L);
    }
    for (var it = 0; it < 4; it++) {
      for (i = 1; i < layers.length; i++) sweep(layers[i], up);
      for (i = layers.length - 2; i >= 0; i--) sweep(layers[i], down);
    }
    // y per layer
    var ly = [], y = 0;
    for (i = 0; i < layers.length; i++) {
      var hmax = 0;
      for (k = 0; k < layers[i].length; k++) hmax = Math.max(hmax, vh[layers[i][k]]);
      ly.push(y);
      y += hmax + RANK_GAP;
    }
    // x: pack, then pull towards neighbours
    var cx = new Array(vw.length);
    function gapOf(x) { return vw[x] === 0 ? 4 : NODE_GAP; }
    function place(L, desired) {
      // isotonic regression of left edges: left[j] >= left[j-1] + w[j-1] + gap
      var off = [], acc = 0, j;
      for (j = 0; j < L.length; j++) { off.push(acc); acc += vw[L[j]] + gapOf(L[j]); }
      var blocks = [];
      for (j = 0; j < L.length; j++) {
        var tval = desired[j] - vw[L[j]] / 2 - off[j];
        blocks.push({ sum: tval, cnt: 1 });
        while (blocks.length > 1) {
          var b1 = blocks[blocks.length - 2], b2 = blocks[blocks.length - 1];
          if (b1.sum / b1.cnt <= b2.sum / b2.cnt) break;
          b1.sum += b2.sum; b1.cnt += b2.cnt; blocks.pop();
        }
      }
      j = 0;
      for (var bi = 0; bi < blocks.length; bi++) {
        var val = blocks[bi].sum / blocks[bi].cnt;
        for (var m = 0; m < blocks[bi].cnt; m++, j++) cx[L[j]] = val + off[j] + vw[L[j]] / 2;
      }
    }
    layers.forEach(function (L) {
      var d = [], acc = 0;
      for (var j = 0; j < L.length; j++) { d.push(acc + vw[L[j]] / 2); acc += vw[L[j]] + gapOf(L[j]); }
      var shift = -acc / 2;
      place(L, d.map(function (x) { return x + shift; }));
    });
    function pull(L, nb) {
      var d = [];
      for (var j = 0; j < L.length; j++) {
        var ns = nb[L[j]];
        if (!ns.length) { d.push(cx[L[j]]); continue; }
        var s2 = 0;
        for (var q = 0; q < ns.length; q++) s2 += cx[ns[q]];
        d.push(s2 / ns.length);
      }
      place(L, d);
    }
    for (it = 0; it < 3; it++) {
      for (i = 1; i < layers.length; i++) pull(layers[i], up);
      for (i = layers.length - 2; i >= 0; i--) pull(layers[i], down);
    }
    var minX = Infinity, maxX = -Infinity;
    for (i = 0; i < vw.length; i++) { minX = Math.min(minX, cx[i] - vw[i] / 2); maxX = Math.max(maxX, cx[i] + vw[i] / 2); }
    if (!vw.length) { minX = 0; maxX = 0; }
    var pos = {};
    for (i = 0; i < n; i++) pos[ids[i]] = [cx[i] - vw[i] / 2 - minX, ly[rank[i]]];
    var out = [];
    for (k = 0; k < routes.length; k++) {
      var ch = routes[k][2], pts = [];
      for (var z = 1; z + 1 < ch.length; z++) pts.push([cx[ch[z]] - minX, ly[vrank[ch[z]]]]);
      out.push([routes[k][0], routes[k][1], pts]);
    }
    return { pos: pos, w: maxX - minX, h: Math.max(0, y - RANK_GAP), routes: out };
  }

  // ---------- one graph panel ----------
  function Panel(G, container) {
    var self = this;
    this.G = G;
    var nodes = G.nodes, N = nodes.length, i;
    var children = {}, top = [];
    for (i = 0; i < N; i++) {
      var p = nodes[i].parent;
      if (p >= 0) (children[p] = children[p] || []).push(i); else top.push(i);
    }
    var expanded = {};
    var maxMs = 0;
    for (i = 0; i < N; i++) if (nodes[i].ms > maxMs) maxMs = nodes[i].ms;
    this.heat = maxMs > 0;

    // ---- header ----
    var s = G.summary, head = el("div", { "class": "head" });
    head.appendChild(el("h1", null, esc(G.title)));
    var stats = '<span>format <b>' + esc(G.format) + '</b></span>';
    stats += '<span>nodes <b class="n-nodes">' + N + '</b></span>';
    if (G.format === "pte") {
      stats += '<span>delegate regions <b class="n-regions">' + s.delegate_regions + '</b></span>';
      stats += '<span>backend nodes <b>' + s.backend_nodes + '</b></span>';
      stats += '<span>kernel calls <b>' + s.kernel_calls + '</b></span>';
      stats += '<span>fallback operators <b class="n-fallbacks">' + s.fallback_ops + '</b></span>';
    }
    head.appendChild(el("div", { "class": "stats" }, stats));
    var notes = (G.notes || []).slice();
    if (G.profile) notes.push(G.profile);
    if (notes.length) head.appendChild(el("div", { "class": "notes" }, notes.map(esc).join("<br>")));
    var tools = el("div", { "class": "tools" });
    var search = el("input", { type: "search", placeholder: "search operator, module, source…", "class": "search" });
    var matches = el("span", { "class": "matches" });
    var bExpand = el("button", { type: "button", "class": "expand-all" }, "expand all");
    var bCollapse = el("button", { type: "button", "class": "collapse-all" }, "collapse all");
    var bFit = el("button", { type: "button", "class": "fit" }, "fit");
    tools.appendChild(search); tools.appendChild(matches);
    if (s.delegate_regions > 0) { tools.appendChild(bExpand); tools.appendChild(bCollapse); }
    tools.appendChild(bFit);
    var heatBox = null;
    if (this.heat) {
      heatBox = el("input", { type: "checkbox", "class": "heat-toggle", checked: "checked" });
      var lab = el("label", { "class": "heat-legend" });
      lab.appendChild(heatBox);
      lab.appendChild(document.createTextNode(" profile heat (max " + fmtMs(maxMs) + " per node and run)"));
      tools.appendChild(lab);
    }
    head.appendChild(tools);
    container.appendChild(head);
    var body = el("div", { "class": "body" });
    var canvas = el("div", { "class": "canvas" });
    var details = el("div", { "class": "details" }, "<p>Click a node for its details.</p>");
    body.appendChild(canvas); body.appendChild(details);
    container.appendChild(body);
    var svg = document.createElementNS(SVGNS, "svg");
    canvas.appendChild(svg);
    var view = document.createElementNS(SVGNS, "g");
    svg.appendChild(view);

    function labelOf(i) {
      var n = nodes[i];
      if (n.kind === "delegate" && children[i]) return n.label + " (" + children[i].length + " nodes)" + (n.ms > 0 ? " · " + fmtMs(n.ms) : "");
      return n.label;
    }
    function textWidth(t) { return Math.min(300, Math.max(56, t.length * 6.6 + 18)); }
    function heatColor(ms) {
      if (!(ms > 0) || !maxMs) return null;
      var f = Math.log(1 + 99 * ms / maxMs) / Math.log(100);  // 0..1, log scale
      var r = 255, g = Math.round(245 - 200 * f), b = Math.round(200 - 190 * f);
      return "rgb(" + r + "," + g + "," + b + ")";
    }

    var geom = {};   // node index -> [x, y, w, h] absolute
    var inner = {};  // region -> its inner layout
    function regionSize(r) {
      var ids = children[r];
      var set = {};
      ids.forEach(function (x) { set[x] = true; });
      var es = [];
      G.edges.forEach(function (e) { if (set[e[0]] && set[e[1]]) es.push([e[0], e[1]]); });
      var L = layout(ids, es, function (x) { return [textWidth(labelOf(x)), NODE_H]; });
      inner[r] = L;
      return [Math.max(L.w + 2 * PAD, textWidth(labelOf(r)) + 40), L.h + 2 * PAD + HEAD];
    }
    function visible(i) {  // the node drawn for i
      var p = nodes[i].parent;
      return p >= 0 && !expanded[p] ? p : i;
    }

    var selected = -1, matchSet = {};
    this.render = function () {
      var sizes = {};
      top.forEach(function (x) {
        sizes[x] = nodes[x].kind === "delegate" && children[x] && expanded[x] ? regionSize(x) : [textWidth(labelOf(x)), nodes[x].kind === "delegate" ? NODE_H + 10 : NODE_H];
      });
      var lifted = [], seen = {};
      G.edges.forEach(function (e) {
        var a = nodes[e[0]].parent >= 0 ? nodes[e[0]].parent : e[0];
        var b = nodes[e[1]].parent >= 0 ? nodes[e[1]].parent : e[1];
        if (a === b) return;
        var key = a + ">" + b;
        if (seen[key]) return;
        seen[key] = 1;
        lifted.push([a, b]);
      });
      var L = layout(top, lifted, function (x) { return sizes[x]; });
      geom = {};
      top.forEach(function (x) { var p = L.pos[x]; geom[x] = [p[0], p[1], sizes[x][0], sizes[x][1]]; });
      Object.keys(expanded).forEach(function (r) {
        r = +r;
        if (!expanded[r] || !inner[r]) return;
        var g0 = geom[r], IL = inner[r];
        var ox = g0[0] + (g0[2] - IL.w) / 2, oy = g0[1] + HEAD + PAD;
        children[r].forEach(function (x) { var p = IL.pos[x]; geom[x] = [ox + p[0], oy + p[1], textWidth(labelOf(x)), NODE_H]; });
        IL.routes.forEach(function (rt) { rt[2] = rt[2].map(function (q) { return [ox + q[0], oy + q[1]]; }); });
      });
      var parts = [];
      function path(a, b, pts, cls) {
        var ga = geom[a], gb = geom[b];
        if (!ga || !gb) return;
        var x0 = ga[0] + ga[2] / 2, y0 = ga[1] + ga[3], x1 = gb[0] + gb[2] / 2, y1 = gb[1];
        var all = [[x0, y0]].concat(pts || [], [[x1, y1]]), d = "M" + x0.toFixed(1) + "," + y0.toFixed(1);
        for (var j = 1; j < all.length; j++) {
          var p0 = all[j - 1], p1 = all[j], my = (p0[1] + p1[1]) / 2;
          d += "C" + p0[0].toFixed(1) + "," + my.toFixed(1) + " " + p1[0].toFixed(1) + "," + my.toFixed(1) + " " + p1[0].toFixed(1) + "," + p1[1].toFixed(1);
        }
        parts.push('<path class="edge' + (cls ? " " + cls : "") + '" d="' + d + '"/>');
      }
      // region blocks first (under their nodes)
      top.forEach(function (x) {
        if (nodes[x].kind !== "delegate") return;
        var g0 = geom[x], ex = !!expanded[x], cls = "region" + (ex ? " expanded" : " collapsed") + (matchSet[x] ? " match" : "") + (selected === x ? " selected" : "");
        var hc = self.heatOn() ? heatColor(nodes[x].ms) : null;
        parts.push('<g class="' + cls + '" data-idx="' + x + '" data-region="' + esc(nodes[x].id) + '">' +
          '<rect x="' + g0[0] + '" y="' + g0[1] + '" width="' + g0[2] + '" height="' + g0[3] + '"' + (hc && !ex ? ' style="fill:' + hc + '"' : "") + '/>' +
          '<text class="toggle" x="' + (g0[0] + 8) + '" y="' + (g0[1] + 16) + '">' + (children[x] ? (ex ? "▾ " : "▸ ") : "") + esc(labelOf(x)) + '</text></g>');
      });
      L.routes.forEach(function (rt) {
        if (expanded[rt[0]] || expanded[rt[1]]) return;  // drawn from the inner nodes below
        path(rt[0], rt[1], rt[2]);
      });
      Object.keys(inner).forEach(function (r) {
        if (!expanded[r]) return;
        inner[r].routes.forEach(function (rt) { path(rt[0], rt[1], rt[2]); });
      });
      // edges between a region's inner nodes and the outside
      var crossSeen = {};
      G.edges.forEach(function (e) {
        var pa = nodes[e[0]].parent, pb = nodes[e[1]].parent;
        if (pa === pb) return;
        var a = visible(e[0]), b = visible(e[1]);
        if (!(pa >= 0 && expanded[pa]) && !(pb >= 0 && expanded[pb])) return;
        if (a === b || crossSeen[a + ">" + b]) return;
        crossSeen[a + ">" + b] = 1;
        path(a, b, [], "cross");
      });
      function nodeSvg(x) {
        var n = nodes[x], g0 = geom[x];
        var cls = "node k-" + n.kind + (n.fallback ? " fallback" : "") + (matchSet[x] ? " match" : "") + (selected === x ? " selected" : "");
        var hc = self.heatOn() ? heatColor(n.ms) : null;
        var label = labelOf(x), maxc = Math.floor((g0[2] - 12) / 6.6);
        if (label.length > maxc) label = label.slice(0, Math.max(1, maxc - 1)) + "…";
        parts.push('<g class="' + cls + '" data-idx="' + x + '"><title>' + esc(labelOf(x) + (n.module ? "\n" + n.module : "") + (n.source ? "\n" + n.source : "") + (n.reason ? "\nnot delegated: " + n.reason : "") + (n.ms > 0 ? "\n" + fmtMs(n.ms) + " per run" : "")) + '</title>' +
          '<rect x="' + g0[0] + '" y="' + g0[1] + '" width="' + g0[2] + '" height="' + g0[3] + '"' + (hc ? ' style="fill:' + hc + '"' : "") + '/>' +
          '<text x="' + (g0[0] + 6) + '" y="' + (g0[1] + 17) + '">' + esc(label) + '</text></g>');
      }
      top.forEach(function (x) { if (nodes[x].kind !== "delegate") nodeSvg(x); });
      Object.keys(expanded).forEach(function (r) { if (expanded[r]) children[r].forEach(nodeSvg); });
      view.innerHTML = parts.join("");
      self.width = L.w; self.height = L.h;
    };
    this.heatOn = function () { return heatBox ? heatBox.checked : false; };

    // ---- pan and zoom ----
    var tx = 20, ty = 20, sc = 1;
    function apply() { view.setAttribute("transform", "translate(" + tx + "," + ty + ") scale(" + sc + ")"); }
    this.fit = function () {
      var W = canvas.clientWidth || 800, H = canvas.clientHeight || 600;
      sc = Math.min(1.5, (W - 40) / Math.max(1, self.width), Math.max((H - 40) / Math.max(1, self.height), 0.25));
      tx = (W - self.width * sc) / 2; ty = 20;
      apply();
    };
    function centerOn(x) {
      var g0 = geom[x];
      if (!g0) return;
      var W = canvas.clientWidth || 800, H = canvas.clientHeight || 600;
      sc = Math.max(sc, 0.8);
      tx = W / 2 - (g0[0] + g0[2] / 2) * sc; ty = H / 2 - (g0[1] + g0[3] / 2) * sc;
      apply();
    }
    canvas.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var r = canvas.getBoundingClientRect(), mx = ev.clientX - r.left, my = ev.clientY - r.top;
      var f = Math.exp(-ev.deltaY * 0.0015), ns = Math.min(4, Math.max(0.02, sc * f));
      tx = mx - (mx - tx) * ns / sc; ty = my - (my - ty) * ns / sc; sc = ns;
      apply();
    }, { passive: false });
    var drag = null, moved = false;
    canvas.addEventListener("mousedown", function (ev) { drag = [ev.clientX, ev.clientY, tx, ty]; moved = false; });
    window.addEventListener("mousemove", function (ev) {
      if (!drag) return;
      if (Math.abs(ev.clientX - drag[0]) + Math.abs(ev.clientY - drag[1]) > 3) moved = true;
      tx = drag[2] + ev.clientX - drag[0]; ty = drag[3] + ev.clientY - drag[1];
      apply();
    });
    window.addEventListener("mouseup", function () { drag = null; });

    // ---- details ----
    function tensorRows(list) {
      if (!list.length) return "<tr><td colspan=3>none</td></tr>";
      return list.map(function (t) {
        return "<tr><td>" + esc(t.name || (t.value !== undefined ? "value " + t.value : "")) + "</td><td>" + esc(shapeText(t)) + "</td><td>" + esc(t.role || "") + "</td></tr>";
      }).join("");
    }
    this.show = function (x) {
      var n = nodes[x], h = "<h2>" + esc(n.label) + "</h2><table>";
      h += "<tr><th>kind</th><td>" + esc(n.kind) + (n.fallback ? " (fallback: not delegated)" : "") + "</td></tr>";
      h += "<tr><th>id</th><td>" + esc(n.id) + "</td></tr>";
      if (n.instruction !== undefined) h += "<tr><th>instruction</th><td>" + n.instruction + "</td></tr>";
      if (n.parent >= 0) h += "<tr><th>region</th><td>" + esc(nodes[n.parent].label) + "</td></tr>";
      if (n.debug_handle !== undefined) h += "<tr><th>debug handle</th><td>" + n.debug_handle + "</td></tr>";
      h += '<tr><th>source</th><td class="source">' + esc(n.source || "(not recorded)") + "</td></tr>";
      h += '<tr><th>module</th><td class="module">' + esc(n.module || "(not recorded)") + "</td></tr>";
      if (n.fallback) h += '<tr><th>not delegated</th><td class="reason">' + esc(n.reason || "reason not recorded for this program") + "</td></tr>";
      if (n.ms !== undefined) h += '<tr><th>time</th><td class="ms">' + fmtMs(n.ms) + " per run</td></tr>";
      if (children[x]) h += "<tr><th>backend nodes</th><td>" + children[x].length + "</td></tr>";
      h += "</table><b>inputs</b><table>" + tensorRows(n.inputs) + "</table><b>outputs</b><table>" + tensorRows(n.outputs) + "</table>";
      if (n.attrs.length) h += "<b>attributes</b><table>" + n.attrs.map(function (a) { return "<tr><th>" + esc(a[0]) + "</th><td>" + esc(a[1]) + "</td></tr>"; }).join("") + "</table>";
      if (n.stack_trace) h += "<b>stack trace</b><pre>" + esc(n.stack_trace) + "</pre>";
      details.innerHTML = h;
      selected = x;
    };
    view.addEventListener("click", function (ev) {
      if (moved) return;
      var t = ev.target.closest ? ev.target.closest("[data-idx]") : null;
      if (!t) return;
      var x = +t.getAttribute("data-idx");
      if (nodes[x].kind === "delegate" && children[x] && (ev.target.classList.contains("toggle") || !expanded[x])) {
        expanded[x] = !expanded[x];
      }
      self.show(x);
      self.render();
    });
    bExpand.addEventListener("click", function () { for (var r in children) expanded[r] = true; self.render(); self.fit(); });
    bCollapse.addEventListener("click", function () { expanded = {}; self.render(); self.fit(); });
    bFit.addEventListener("click", function () { self.fit(); });
    if (heatBox) heatBox.addEventListener("change", function () { self.render(); });

    // ---- search ----
    var hits = [], hitAt = -1;
    function runSearch() {
      var q = search.value.trim().toLowerCase();
      matchSet = {}; hits = []; hitAt = -1;
      if (q) {
        for (var j = 0; j < N; j++) {
          var n = nodes[j], hay = (n.label + " " + n.id + " " + (n.module || "") + " " + (n.source || "") + " " + (n.reason || "")).toLowerCase();
          if (hay.indexOf(q) >= 0) { hits.push(j); matchSet[visible(j)] = true; }
        }
      }
      matches.textContent = q ? hits.length + " match" + (hits.length === 1 ? "" : "es") : "";
      self.render();
    }
    search.addEventListener("input", runSearch);
    search.addEventListener("keydown", function (ev) {
      if (ev.key !== "Enter" || !hits.length) return;
      hitAt = (hitAt + 1) % hits.length;
      var x = hits[hitAt], p = nodes[x].parent;
      if (p >= 0 && !expanded[p]) { expanded[p] = true; matchSet[x] = true; }
      self.show(x);
      self.render();
      centerOn(x);
    });

    this.render();
    this.fit();
  }

  // ---------- the page ----------
  var root = el("div", { "class": DATA.mode === "compare" ? "root compare-mode" : "root" });
  document.body.appendChild(root);
  if (DATA.mode === "compare") {
    var A = DATA.graphs[0], B = DATA.graphs[1];
    var cmp = el("div", { "class": "compare" });
    function row(name, a, b, cls) {
      return "<tr" + (cls ? ' class="' + cls + '"' : "") + "><td>" + esc(name) + "</td><td>" + a + "</td><td>" + b + '</td><td class="' + (a !== b ? "diff" : "") + '">' + (typeof a === "number" && typeof b === "number" ? (b - a > 0 ? "+" : "") + (b - a) : "") + "</td></tr>";
    }
    var h = "<table class=\"compare-table\"><tr><th></th><th>" + esc(A.title) + "</th><th>" + esc(B.title) + "</th><th>B − A</th></tr>";
    h += row("delegate regions", A.summary.delegate_regions, B.summary.delegate_regions, "regions");
    h += row("backend nodes", A.summary.backend_nodes, B.summary.backend_nodes);
    h += row("kernel calls", A.summary.kernel_calls, B.summary.kernel_calls);
    h += row("fallback operators", A.summary.fallback_ops, B.summary.fallback_ops, "fallbacks");
    [["operators", "kernel operator"], ["backend_operators", "backend node"]].forEach(function (kind) {
      var names = {};
      Object.keys(A.summary[kind[0]]).concat(Object.keys(B.summary[kind[0]])).forEach(function (k) { names[k] = 1; });
      Object.keys(names).sort().forEach(function (k) {
        h += row(kind[1] + " " + k, A.summary[kind[0]][k] || 0, B.summary[kind[0]][k] || 0, "op");
      });
    });
    cmp.innerHTML = h + "</table>";
    root.appendChild(cmp);
  }
  var panels = el("div", { "class": "panels" });
  root.appendChild(panels);
  window.kilnPanels = DATA.graphs.map(function (G) {
    var c = el("div", { "class": "panel" });
    panels.appendChild(c);
    return new Panel(G, c);
  });
  // sizes are known once every panel is in the page
  window.kilnPanels.forEach(function (p) { p.fit(); });
  window.addEventListener("resize", function () { window.kilnPanels.forEach(function (p) { p.fit(); }); });
})();
