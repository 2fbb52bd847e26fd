"""`kiln view`: the HTML graph of GPT-2 small's programs (kiln's XNNPACK and portable
lowerings, ExecuTorch's own XNNPACK lowering), opened in headless Chromium (Debian's
`chromium`, driven by Playwright with that executable; nothing is downloaded).

Oracles: the counts the page shows are checked against the .pte read by ExecuTorch's
own deserializer (delegate calls, kernel calls) and its XNNPACK payloads decoded by
flatc; source lines against torch.export's own node metadata; the Model Explorer JSON
against ai-edge-model-explorer's dataclasses and serializer. Screenshots go to
artifacts/view/ for a person to look at.
"""
from __future__ import annotations

import json
import operator
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, et_lower, kiln_lower, run_kiln, spec_of

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = REPO / "artifacts" / "view"


def pte_counts(pte: Path, tmp: Path) -> dict:
    """Delegate calls, kernel calls and XNNPACK nodes per delegate, read by ExecuTorch's deserializer."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from test_xnnpack_payload import decode_graph

    program = deserialize_pte_binary(pte.read_bytes()).program
    plan = next(p for p in program.execution_plan if p.name == "forward")
    kinds = [type(i.instr_args).__name__ for c in plan.chains for i in c.instructions]
    aten = [i for c in plan.chains for i in c.instructions if type(i.instr_args).__name__ == "KernelCall"
            and plan.operators[i.instr_args.op_index].name.startswith("aten::")]
    xnodes = []
    for i, d in enumerate(plan.delegates):
        (tmp / f"payload{i}").mkdir(parents=True, exist_ok=True)
        g = decode_graph(program.backend_delegate_data[d.processed.index].data, tmp / f"payload{i}")
        xnodes.append(len(g["xnodes"]))
    return {"delegate_calls": kinds.count("DelegateCall"), "kernel_calls": kinds.count("KernelCall"),
            "aten_calls": len(aten), "xnodes": xnodes, "inputs": len(plan.inputs), "outputs": len(plan.outputs)}


class Page:
    """One page in headless Chromium; every console error and page error is kept, every request
    that is not the page's own file is refused (the page must need no network)."""

    def __init__(self, pw, html: Path, width=1600, height=1000):
        self.browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        self.page = self.browser.new_page(viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        url = html.resolve().as_uri()

        def route(r):
            if r.request.url == url:
                r.continue_()
            else:
                self.requests.append(r.request.url)
                r.abort()
        self.page.route("**/*", route)
        self.page.goto(url)
        self.page.wait_for_selector(".panel svg")

    def close(self):
        self.browser.close()


@pytest.fixture(scope="module")
def playwright():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is needed (scripts/setup installs it)"
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def gpt2(gpt2_small):
    """GPT-2 small (default IR): spec, kiln's xnnpack and portable .pte, ExecuTorch's xnnpack .pte."""
    return {"spec": gpt2_small,
            "kiln-xnnpack": kiln_lower(gpt2_small, "xnnpack"),
            "kiln-portable": kiln_lower(gpt2_small, "portable"),
            "et-xnnpack": et_lower(gpt2_small, "xnnpack")}


pytestmark = pytest.mark.parametrize("gpt2_small", ["default"], indirect=True)


def fallback_reasons(pte: Path) -> dict:
    meta = pte.with_suffix(".json")
    return (json.loads(meta.read_text()).get("delegation") or {}).get("fallback_reasons", {}) if meta.exists() else {}


@pytest.mark.parametrize("which", ["kiln-xnnpack", "kiln-portable", "et-xnnpack"])
def test_view_pte_opens_in_chromium(which, gpt2, playwright, tmp_path):
    pte = gpt2[which]
    html = tmp_path / f"{which}.html"
    proc = run_kiln("view", pte, "-o", html)
    assert html.exists() and proc.stderr == ""
    want = pte_counts(pte, tmp_path)
    if which == "et-xnnpack":
        assert want["delegate_calls"] > 1  # ExecuTorch's lowering splits GPT-2 into many regions
    p = Page(playwright, html)
    try:
        page = p.page
        assert page.locator(".region").count() == want["delegate_calls"]
        fallbacks = want["kernel_calls"] if want["delegate_calls"] else 0
        assert page.locator(".node.fallback").count() == fallbacks
        assert page.locator(".node.k-kernel").count() == want["kernel_calls"]
        assert int(page.locator(".n-regions").inner_text()) == want["delegate_calls"]
        if want["delegate_calls"]:
            # every region expanded holds the payload's XNNPACK nodes
            page.click(".expand-all")
            assert page.locator(".node.k-backend_node").count() == sum(want["xnodes"])
            assert page.locator(".region.expanded").count() == want["delegate_calls"]
            page.click(".collapse-all")
        if fallbacks:
            page.locator(".node.fallback").first.click()
            reason = page.locator(".details .reason").inner_text()
            reasons = fallback_reasons(pte)
            label = page.locator(".details h2").inner_text()
            if which == "kiln-xnnpack":  # kiln's report says why, per operator
                assert reasons, "kiln lower's report has fallback reasons"
                assert any(r in reason for rs in reasons.values() for r in rs), (label, reason, reasons)
        # search finds the operators by name: as many hits as kernel calls of that operator
        page.fill(".search", "aten::")
        hits = int(page.locator(".matches").inner_text().split()[0])
        assert hits == want["aten_calls"]
        page.fill(".search", "")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"gpt2_{which}.png"))
        assert p.errors == [], p.errors
        assert p.requests == [], p.requests
    finally:
        p.close()


def torch_call_functions(pt2: Path):
    """(target, source line) of every call_function node, from torch.export's own load."""
    import torch

    ep = torch.export.load(str(pt2))
    out = []
    for n in ep.graph.nodes:
        # torch's loader adds a getitem node per output of a multi-output op; the archive has none
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        trace = n.meta.get("stack_trace") or ""
        frames = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith('File "')]
        src = ""
        for f in frames:  # the innermost frame outside torch's own files
            path = f.split('"')[1]
            line = f.split("line ")[1].split(",")[0]
            if "/torch/" not in path or not src:
                src = f"{Path(path).name}:{line}"
        out.append((n, src))
    return out


def test_view_pt2_shows_source_lines_and_modules(gpt2, playwright, tmp_path):
    pt2 = gpt2["spec"].parent / spec_of(gpt2["spec"])["exported_program"]
    html = tmp_path / "pt2.html"
    run_kiln("view", pt2, "-o", html)
    nodes = torch_call_functions(pt2)
    p = Page(playwright, html)
    try:
        page = p.page
        assert page.locator(".node.k-op").count() == len(nodes)
        # a node of the attention: search by module path, click it, the source line shows
        target = next(i for i, (n, src) in enumerate(nodes)
                      if "attn" in str(list(n.meta.get("nn_module_stack", {}).values())[-1:]) and src)
        node, src = nodes[target]
        module = list(node.meta["nn_module_stack"].values())[-1][0]
        page.locator(f'.node[data-idx="{target + 1}"]').click()  # one user input precedes the ops
        assert page.locator(".details .source").inner_text() == src
        shown = page.locator(".details .module").inner_text()
        assert shown == module, (shown, module)
        page.fill(".search", "attn")
        assert int(page.locator(".matches").inner_text().split()[0]) >= 12 * 4
        page.screenshot(path=str(SHOTS / "gpt2_pt2.png"))
        assert p.errors == [], p.errors
        assert p.requests == [], p.requests
    finally:
        p.close()


def test_view_pte_with_debug_map_shows_source(gpt2, playwright, tmp_path):
    """A debug map (docs/PROFILING.md's "kiln-debug-map") beside a .pte gives its nodes source lines."""
    pte = tmp_path / "gpt2_portable.pte"
    shutil.copy(gpt2["kiln-portable"], pte)
    dmap = {"format": "kiln-debug-map", "version": 1, "pte": pte.name, "method": "forward",
            "instructions": [{"index": 0, "kind": "kernel", "debug_handle": 7}],
            "regions": [],
            "nodes": [{"debug_handle": 7, "name": "embedding", "module_path": "model.transformer.wte",
                       "source": {"file": "/x/modeling_gpt2.py", "line": 641, "location": "modeling_gpt2.py:641"}}]}
    (tmp_path / "gpt2_portable.debug.json").write_text(json.dumps(dmap))
    html = tmp_path / "dbg.html"
    run_kiln("view", pte, "-o", html)
    p = Page(playwright, html)
    try:
        page = p.page
        page.locator('.node[data-idx="1"]').click()  # instruction 0 (after the one input)
        assert page.locator(".details .source").inner_text() == "modeling_gpt2.py:641"
        assert page.locator(".details .module").inner_text() == "model.transformer.wte"
        assert p.errors == [], p.errors
    finally:
        p.close()


def test_view_profile_heat(gpt2, playwright, tmp_path):
    """kiln bench --profile --json's time per operator, spread over that operator's calls."""
    pte = gpt2["kiln-portable"]
    prof = tmp_path / "prof.json"
    proc = run_kiln("bench", pte, "--iters", "1", "--warmup", "0", "--profile", "--json")
    prof.write_text(proc.stdout)
    profile = json.loads(proc.stdout)["profile"]
    html = tmp_path / "heat.html"
    run_kiln("view", pte, "--profile", prof, "-o", html)
    want = pte_counts(pte, tmp_path)
    p = Page(playwright, html)
    try:
        page = p.page
        assert page.locator(".heat-toggle").count() == 1
        node = page.locator(".node.k-kernel").first
        node.click()
        label = page.locator(".details h2").inner_text()
        from executorch.exir._serialize._program import deserialize_pte_binary

        program = deserialize_pte_binary(pte.read_bytes()).program
        plan = program.execution_plan[0]
        ops = [plan.operators[i.instr_args.op_index] for c in plan.chains for i in c.instructions
               if type(i.instr_args).__name__ == "KernelCall"]
        calls = sum(1 for o in ops if (o.name + ("." + o.overload if o.overload else "")) == label)
        assert calls > 0 and len(ops) == want["kernel_calls"]
        ms = profile[label]["ms_per_run"] / calls
        shown = page.locator(".details .ms").inner_text()
        value = float(shown.split()[0]) / (1000.0 if shown.split()[1] == "µs" else 1.0)
        assert abs(value - ms) <= max(0.01 * ms, 1e-4), (shown, ms)
        assert p.errors == [], p.errors
    finally:
        p.close()


def test_compare_side_by_side(gpt2, playwright, tmp_path):
    a, b = gpt2["kiln-xnnpack"], gpt2["et-xnnpack"]
    html = tmp_path / "diff.html"
    run_kiln("view", "--compare", a, b, "-o", html)
    ca, cb = pte_counts(a, tmp_path / "a"), pte_counts(b, tmp_path / "b")
    p = Page(playwright, html, width=1800)
    try:
        page = p.page
        cells = page.locator(".compare-table tr.regions td").all_inner_texts()
        assert [int(cells[1]), int(cells[2])] == [ca["delegate_calls"], cb["delegate_calls"]]
        cells = page.locator(".compare-table tr.fallbacks td").all_inner_texts()
        assert [int(cells[1]), int(cells[2])] == [ca["kernel_calls"], cb["kernel_calls"]]
        panels = page.locator(".panel")
        assert panels.count() == 2
        assert panels.nth(0).locator(".region").count() == ca["delegate_calls"]
        assert panels.nth(1).locator(".region").count() == cb["delegate_calls"]
        page.screenshot(path=str(SHOTS / "gpt2_compare_kiln_vs_executorch.png"))
        assert p.errors == [], p.errors
    finally:
        p.close()


def test_model_explorer_json_loads(gpt2, tmp_path):
    """The JSON goes through ai-edge-model-explorer's own graph classes (graph_builder, filled the way
    its runner fills them, with dacite) and its own serializer back to the same JSON."""
    import dacite
    from model_explorer import graph_builder
    from model_explorer.utils import convert_adapter_response

    pte = gpt2["et-xnnpack"]
    out = tmp_path / "me.json"
    run_kiln("view", pte, "--model-explorer", out)
    data = json.loads(out.read_text())
    assert isinstance(data, dict) and data["label"] and data["graphs"]  # one collection, as the web app takes it
    coll = dacite.from_dict(data_class=graph_builder.GraphCollection, data=data,
                            config=dacite.Config(strict=True))
    graph = coll.graphs[0]
    want = pte_counts(pte, tmp_path)
    ids = {n.id for n in graph.nodes}
    assert len(ids) == len(graph.nodes)
    for n in graph.nodes:  # every edge names a node of the graph
        for e in n.incomingEdges:
            assert e.sourceNodeId in ids, (n.id, e.sourceNodeId)
    # the delegate regions are namespaces holding the payloads' nodes
    by_ns = {}
    for n in graph.nodes:
        if n.namespace:
            by_ns[n.namespace] = by_ns.get(n.namespace, 0) + 1
    assert sorted(by_ns.values()) == sorted(want["xnodes"])
    kinds = [next(a.value for a in n.attrs if a.key == "kind") for n in graph.nodes]
    assert kinds.count("kernel") == want["kernel_calls"]
    back = convert_adapter_response({"graphCollections": [coll]})["graphCollections"][0]
    assert back["graphs"][0]["nodes"][5]["incomingEdges"] == data["graphs"][0]["nodes"][5]["incomingEdges"]
    assert len(back["graphs"][0]["nodes"]) == len(data["graphs"][0]["nodes"])


def test_bad_input(tmp_path, gpt2):
    def check(proc, *outs):
        assert proc.returncode == 1, proc
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kiln: error: "), proc.stderr
        for o in outs:
            assert not o.exists(), o
        assert not [f for f in tmp_path.iterdir() if "kiln-tmp" in f.name]

    text = tmp_path / "notes.txt"
    text.write_text("not a program\n" * 10)
    check(run_kiln("view", text, "-o", tmp_path / "a.html", check=False), tmp_path / "a.html")
    damaged = tmp_path / "damaged.pte"
    damaged.write_bytes(gpt2["kiln-portable"].read_bytes()[:4096])
    check(run_kiln("view", damaged, "-o", tmp_path / "b.html", check=False), tmp_path / "b.html")
    zipped = tmp_path / "damaged.pt2"
    zipped.write_bytes(b"PK\x03\x04" + b"\0" * 200)
    check(run_kiln("view", zipped, "-o", tmp_path / "c.html", check=False), tmp_path / "c.html")
    check(run_kiln("view", tmp_path / "missing.pte", check=False))
    check(run_kiln("view", gpt2["kiln-portable"], "-o", tmp_path / "no" / "dir" / "d.html", check=False))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.geteuid() != 0:  # root writes anywhere; then a file in the way of the directory instead
            check(run_kiln("view", gpt2["kiln-portable"], "-o", locked / "e.html", check=False), locked / "e.html")
        blocker = tmp_path / "file"
        blocker.write_text("x")
        check(run_kiln("view", gpt2["kiln-portable"], "-o", blocker / "e.html", check=False))
    finally:
        locked.chmod(stat.S_IRWXU)
    prof = tmp_path / "prof.json"
    prof.write_text("{\"nothing\": 1}")
    check(run_kiln("view", gpt2["kiln-portable"], "--profile", prof, "-o", tmp_path / "f.html", check=False),
          tmp_path / "f.html")
    check(run_kiln("view", "--compare", gpt2["kiln-portable"], text, "-o", tmp_path / "g.html", check=False),
          tmp_path / "g.html")


SERVE = """
import sys
from model_explorer import server
from model_explorer.config import ModelExplorerConfig
c = ModelExplorerConfig()
c.add_model_from_path(sys.argv[1])
server.start(host="127.0.0.1", port=int(sys.argv[2]), config=c, no_open_in_browser=True, skip_health_check=True)
"""


def test_model_explorer_web_app_opens_it(gpt2, playwright, tmp_path):
    """ai-edge-model-explorer's own server and web app (its JSON graph loader) read the file: the
    graph info it shows counts every node (inputs, outputs, kernel calls, the payloads' nodes)."""
    import re
    import socket
    import time
    import urllib.parse
    import urllib.request

    pte = gpt2["et-xnnpack"]
    out = tmp_path / "me.json"
    run_kiln("view", pte, "--model-explorer", out)
    want = pte_counts(pte, tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(out), str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}/"
        for _ in range(600):  # the server imports its adapters (torch among them) before it listens
            try:
                urllib.request.urlopen(base, timeout=2).read(10)
                break
            except OSError:
                assert server.poll() is None, "model explorer's server exited"
                time.sleep(0.5)
        data = urllib.parse.quote(json.dumps({"models": [{"url": str(out)}]}))
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(300_000)  # the app lays the graph out on its page's thread after it shows the info
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
            page.goto(base + "?data=" + data)
            page.wait_for_function("document.body.innerText.includes('layer count')", timeout=240_000)
            text = page.inner_text("body")
            assert "Unsupported JSON format" not in text
            nodes = int(re.search(r"op node count\s+(\d+)", text).group(1))
            assert re.search(r"layer count\s+(\d+)", text)
            assert nodes == want["inputs"] + want["outputs"] + want["kernel_calls"] + sum(want["xnodes"])
            page.screenshot(path=str(SHOTS / "gpt2_et_xnnpack_model_explorer.png"))
        finally:
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
