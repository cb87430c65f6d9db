"""The documentation site builds offline and renders math and diagrams in a real browser.

Generates the contract pages for every contract in contracts/ into a temporary copy of site/,
builds it with `mkdocs build --strict`, serves it on 127.0.0.1 and loads pages in headless
Chromium, driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`, no extra
packages). Why not `--dump-dom`: Material renders a mermaid diagram into a *closed* shadow root,
which `--dump-dom` does not serialise; the only `<svg` it shows are the theme's icons, so a text
search would pass even with the diagram broken. The protocol's DOM.getDocument(pierce=true)
sees inside, and its network events prove that every request stayed on 127.0.0.1 (the outside
is also unresolvable for this browser, so a CDN fallback cannot quietly succeed).

Screenshots land in the pytest tmp dir (path printed with -s) for a human to look at.
"""

from __future__ import annotations

import base64
import fcntl
import http.server
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from falsify.harness import conformance as conformance_ledger
from falsify.harness.docs import write_site
from falsify.harness.latex import to_latex
from falsify.harness.validate import load_all
from tests.test_docs_pages import FakeCoverage

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = ("headless Chromium is required for the docs site test and was not found on PATH. "
                "Install it: `apt-get install -y chromium` (Debian/Ubuntu). This test does not "
                "skip: a site whose math and diagrams were never rendered is not tested.")
SOFTMAX = "softmax-kernel-v1"
# the committed conformance ledger the published site shows (pyproject's `conformance`)
CONFORMANCE = ROOT / "evidence" / "conformance.json"
# the smallest label a person reads without zooming, in a 1280 px wide window
MIN_LABEL_PX = 11.0
# the site is built as GitHub Pages builds a project site: under a path, not at the server root
PROJECT_SITE = "https://owner.github.io/falsify/"


def find_chromium() -> str:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(INSTALL_HINT, pytrace=False)


# --------------------------------------------------------------------------------------------
# a minimal DevTools-protocol client over --remote-debugging-pipe (fd 3: commands in, fd 4:
# responses out, messages separated by NUL)


class Chromium:
    def __init__(self, exe: str, profile: Path, log: Path):
        cmd_r, self._cmd_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        # Park the child's ends above 3 and 4, so moving them there cannot clobber each other.
        cmd_r, resp_w = (_high_fd(fd) for fd in (cmd_r, resp_w))
        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--hide-scrollbars", f"--user-data-dir={profile}",
                # nothing but the local server resolves: a CDN fallback fails loudly
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--remote-debugging-pipe", "about:blank"]
        # Chromium reads the protocol on fds 3 and 4; move our pipe ends there in the child
        # (a shell `exec` instead of preexec_fn, which is unsafe next to the server thread).
        script = f'exec 3<&{cmd_r} 4>&{resp_w} {cmd_r}<&- {resp_w}>&-; exec "$@"'
        self._log = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(["bash", "-c", script, "bash", *args],
                                     pass_fds=(cmd_r, resp_w), stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        os.close(cmd_r)
        os.close(resp_w)
        self._next = 0
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        buf = b""
        while True:
            chunk = os.read(self._resp_r, 1 << 20)
            if not chunk:
                self._q.put(None)
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                self._q.put(json.loads(msg))

    def _pump(self, timeout: float) -> bool:
        try:
            msg = self._q.get(timeout=timeout)
        except queue.Empty:
            return False
        if msg is None:
            raise RuntimeError(f"chromium exited (code {self.proc.poll()}); see its log")
        if "id" in msg:
            self._replies[msg["id"]] = msg
        else:
            self.events.append(msg)
        return True

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 20.0) -> dict:
        self._next += 1
        mid = self._next
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while mid not in self._replies:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply to {method} in {timeout} s")
            self._pump(0.2)
        reply = self._replies.pop(mid)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, session: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e.get("method") == method and e.get("sessionId") == session:
                    return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} in {timeout} s")
            self._pump(0.2)

    def drain(self):
        while self._pump(0.05):
            pass

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - it may already be gone; kill below
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        self._log.close()


def _high_fd(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


def _walk(node: dict):
    yield node
    for key in ("children", "shadowRoots", "pseudoElements"):
        for child in node.get(key, []) or []:
            yield from _walk(child)
    if node.get("contentDocument"):
        yield from _walk(node["contentDocument"])


def _classes(node: dict) -> list[str]:
    attrs = node.get("attributes") or []
    d = dict(zip(attrs[::2], attrs[1::2]))
    return d.get("class", "").split()


# Per node of a drawn diagram: its label's rendered font size (the computed size in the SVG's
# user units times the scale the SVG is drawn at: mermaid sets width 100% and a max-width, so a
# wide diagram is shrunk to the column) and the text. Runs on the <svg> itself, which the
# protocol reaches inside Material's closed shadow root.
MEASURE_LABELS = """function () {
  const box = this.getBoundingClientRect();
  const vb = this.viewBox && this.viewBox.baseVal;
  const scale = vb && vb.width ? box.width / vb.width : 1;
  const labels = [...this.querySelectorAll("g.node")].map((n) => {
    const t = n.querySelector(".nodeLabel") || n.querySelector("text");
    return {text: t.textContent.trim(),
            font_px: parseFloat(getComputedStyle(t).fontSize) * scale,
            height_px: t.getBoundingClientRect().height};
  });
  return {width: box.width, height: box.height, scale: scale, labels: labels};
}"""


def measure_graph_labels(browser: Chromium, sid: str, svgs: list[dict]) -> list[dict]:
    """MEASURE_LABELS on each drawn diagram (DOM nodes from DOM.getDocument)."""
    out = []
    for svg in svgs:
        obj = browser.send("DOM.resolveNode", {"backendNodeId": svg["backendNodeId"]},
                           session=sid)["object"]
        res = browser.send("Runtime.callFunctionOn",
                           {"functionDeclaration": MEASURE_LABELS, "objectId": obj["objectId"],
                            "returnByValue": True}, session=sid)
        assert "exceptionDetails" not in res, res["exceptionDetails"]
        out.append(res["result"]["value"])
    return out


def inspect_page(browser: Chromium, url: str, shot: Path, want_math: bool,
                 timeout: float = 20.0, measure: bool = False, diagrams: bool = True,
                 evaluate: str | None = None) -> dict:
    """Load `url`, wait until it rendered (math when wanted, every mermaid block), take a
    full-page screenshot. Returns what was found; with `measure`, the rendered size of every
    diagram's labels (`labels`, one entry per diagram); with `evaluate` (a JavaScript function
    taking no argument), what it returns on the rendered page (`evaluated`)."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    sid = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
        "sessionId"]
    for m in ("Page.enable", "Network.enable", "DOM.enable"):
        browser.send(m, session=sid)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                 session=sid)
    browser.send("Page.navigate", {"url": url}, session=sid)
    browser.wait_event("Page.loadEventFired", sid, timeout)
    deadline = time.monotonic() + timeout
    while True:
        root = browser.send("DOM.getDocument", {"depth": -1, "pierce": True}, session=sid)["root"]
        nodes = list(_walk(root))
        katex = sum("katex" in _classes(n) for n in nodes)
        hosts = [n for n in nodes if "mermaid" in _classes(n)
                 and (n.get("localName") or "").lower() == "div"]
        drawn = [h for h in hosts if any((x.get("localName") or "").lower() == "svg"
                                         for x in _walk(h) if x is not h)]
        pending = [n for n in nodes if "mermaid" in _classes(n)
                   and (n.get("localName") or "").lower() == "pre"]
        done = ((katex or not want_math) and (hosts or not diagrams)
                and len(drawn) == len(hosts) and not pending)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    html = browser.send("DOM.getOuterHTML", {"nodeId": root["nodeId"]}, session=sid)["outerHTML"]
    labels = []
    if measure:
        svgs = [next(x for x in _walk(h) if x is not h
                     and (x.get("localName") or "").lower() == "svg") for h in drawn]
        labels = measure_graph_labels(browser, sid, svgs)
    evaluated = None
    if evaluate:
        res = browser.send("Runtime.evaluate", {"expression": f"({evaluate})()",
                                                "returnByValue": True}, session=sid)
        assert "exceptionDetails" not in res, res["exceptionDetails"]
        evaluated = res["result"].get("value")
    size = browser.send("Page.getLayoutMetrics", session=sid)["cssContentSize"]
    height = min(int(size["height"]) + 1, 16000)
    png = browser.send("Page.captureScreenshot",
                       {"format": "png", "captureBeyondViewport": True,
                        "clip": {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1}},
                       session=sid, timeout=30)["data"]
    shot.write_bytes(base64.b64decode(png))
    browser.drain()
    requests = [e["params"]["request"]["url"] for e in browser.events
                if e.get("sessionId") == sid and e.get("method") == "Network.requestWillBeSent"]
    failed = [(e["params"].get("errorText"), e["params"].get("requestId")) for e in browser.events
              if e.get("sessionId") == sid and e.get("method") == "Network.loadingFailed"]
    bad_status = [(e["params"]["response"]["url"], e["params"]["response"]["status"])
                  for e in browser.events if e.get("sessionId") == sid
                  and e.get("method") == "Network.responseReceived"
                  and e["params"]["response"]["status"] >= 400]
    browser.send("Target.closeTarget", {"targetId": target})
    return dict(html=html, katex=katex, mermaid_hosts=len(hosts), mermaid_svgs=len(drawn),
                mermaid_pending=len(pending), requests=requests, failed=failed,
                bad_status=bad_status, shot=shot, height=height, labels=labels,
                evaluated=evaluated)


def katex_errors(browser: Chromium, url: str, items: list[tuple[str, str]]) -> list[str]:
    """Every equation's LaTeX through the vendored KaTeX with throwOnError, in the browser:
    one page load checks all contracts, not just the page that was looked at."""
    target = browser.send("Target.createTarget", {"url": url})["targetId"]
    sid = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
        "sessionId"]
    deadline = time.monotonic() + 20
    check = ("(items) => { if (typeof katex === 'undefined') return null; "
             "const bad = []; for (const [name, tex] of items) { try { "
             "katex.renderToString(tex, {displayMode: true, throwOnError: true}); } "
             "catch (e) { bad.push(name + ': ' + e.message); } } return bad; }")
    expr = f"({check})({json.dumps(items)})"
    while True:
        res = browser.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                           session=sid)
        if "exceptionDetails" in res or res["result"].get("value") is not None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("KaTeX never loaded")
        time.sleep(0.2)  # katex not loaded yet
    browser.send("Target.closeTarget", {"targetId": target})
    assert "exceptionDetails" not in res, res["exceptionDetails"]
    return res["result"]["value"]


# --------------------------------------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """site/ copied to a tmp dir, pages generated there, built with --strict."""
    if not _has_module("mkdocs"):
        pytest.fail("mkdocs is required: pip install 'falsify[docs]' (mkdocs==1.6.1, "
                    "mkdocs-material, pymdown-extensions)", pytrace=False)
    tmp = tmp_path_factory.mktemp("site")
    site = tmp / "site"
    shutil.copytree(ROOT / "site", site, ignore=shutil.ignore_patterns("build", "contracts"))
    rep = load_all([ROOT / "falsify" / "contracts"])
    assert rep.contracts, "no contracts found"
    written = write_site(rep.contracts, FakeCoverage.mixed(rep.contracts), site,
                         conformance=(CONFORMANCE.relative_to(ROOT).as_posix(),
                                      conformance_ledger.load(CONFORMANCE)))
    assert site / "docs" / "contracts" / f"{SOFTMAX}.md" in written
    out = tmp / "html"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", SITE_URL=PROJECT_SITE)
    # cwd = repository root: the snippets base path "." then finds falsify/contracts/FORMAT.md
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(site / "mkdocs.yml"), "-d", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert "WARNING" not in proc.stderr, proc.stderr
    return dict(out=out, tmp=tmp, contracts=rep.contracts)


def _neighbourhood(built_site, cid: str) -> int:
    """How many contracts a contract page's dependency diagram draws."""
    from falsify.harness.graph import mermaid

    return mermaid(built_site["contracts"], focus=cid).count('["')


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.fixture(scope="module")
def server(built_site):
    handler = partial(_Quiet, directory=str(built_site["out"]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_static_build_is_complete(built_site):
    out = built_site["out"]
    for c in built_site["contracts"]:
        assert (out / "contracts" / c.id / "index.html").is_file(), c.id
    page = (out / "contracts" / SOFTMAX / "index.html").read_text()
    assert 'class="arithmatex"' in page  # math left for KaTeX, not mangled by markdown
    assert '<pre class="mermaid">' in page
    for asset in ("assets/vendor/katex/katex.min.js", "assets/vendor/katex/katex.min.css",
                  "assets/vendor/katex/contrib/auto-render.min.js",
                  "assets/vendor/mermaid/mermaid.min.js", "assets/katex-init.js"):
        assert (out / asset).is_file(), asset
        assert asset in page, f"{asset} not linked from the page"
    fonts = list((out / "assets/vendor/katex/fonts").glob("*.woff2"))
    assert len(fonts) >= 20, "KaTeX fonts missing"
    # every script and stylesheet the HTML names is local (rel="canonical" names the page's
    # published URL, site_url: nothing is fetched from it)
    tags = [t for t in re.findall(r"<(?:script|link)[^>]*>", page) if 'rel="canonical"' not in t]
    for ref in re.findall(r'(?:src|href)="([^"]+)"', "".join(tags)):
        assert not re.match(r"^(https?:)?//", ref), f"remote asset referenced: {ref}"
    guide = (out / "guide" / "contract-format" / "index.html").read_text()
    assert "Check kinds" in guide  # falsify/contracts/FORMAT.md included via snippets


def test_404_links_resolve_under_a_project_site(built_site):
    """GitHub Pages serves 404.html for any missing path at any depth, so its links must be
    absolute under the site's base path (/falsify/), not the server root nor relative."""
    out = built_site["out"]
    page = (out / "404.html").read_text()
    base = "/falsify/"
    refs = [r for r in re.findall(r'(?:href|src)="([^"]+)"', page)
            if not re.match(r"^(https?:|mailto:|#|data:)", r)]
    assert refs, "404.html links nothing"
    for ref in refs:
        assert ref.startswith(base), f"404.html: {ref!r} does not resolve under {base}"
        path = ref[len(base):].split("#")[0].split("?")[0]
        assert (out / path).is_file() or (out / path / "index.html").is_file(), ref


def test_pages_workflow_gives_mkdocs_the_published_url():
    """site_url comes from SITE_URL, which the Pages workflow sets to the published base URL
    (actions/configure-pages' base_url: owner.github.io/repo/, or a custom domain)."""
    import yaml

    cfg = (ROOT / "site" / "mkdocs.yml").read_text()
    assert re.search(r"^site_url: !ENV \[SITE_URL, ", cfg, re.M), "site_url is not from SITE_URL"
    steps = yaml.safe_load((ROOT / ".github/workflows/docs.yml").read_text())
    steps = steps["jobs"]["build"]["steps"]
    pages = [s for s in steps if str(s.get("uses", "")).startswith("actions/configure-pages@")]
    assert pages and pages[0].get("id")
    build = next(s for s in steps if "mkdocs build" in s.get("run", ""))
    assert build["env"]["SITE_URL"] == f"${{{{ steps.{pages[0]['id']}.outputs.base_url }}}}/"
    assert steps.index(pages[0]) < steps.index(build)


def test_pages_render_offline_in_chromium(built_site, server, capsys):
    exe = find_chromium()
    tmp = built_site["tmp"]
    browser = Chromium(exe, tmp / "profile", tmp / "chromium.log")
    try:
        sm = inspect_page(browser, f"{server}/contracts/{SOFTMAX}/", tmp / f"{SOFTMAX}.png",
                          want_math=True)
        ix = inspect_page(browser, f"{server}/contracts/", tmp / "contracts-index.png",
                          want_math=False, measure=True)
        # the contract pages with the largest dependency diagrams
        big = sorted(built_site["contracts"], key=lambda c: (-_neighbourhood(built_site, c.id),
                                                             c.id))[:3]
        focus = {c.id: inspect_page(browser, f"{server}/contracts/{c.id}/",
                                    tmp / f"{c.id}.png", want_math=False, measure=True)
                 for c in big}
        bad_tex = katex_errors(browser, f"{server}/contracts/{SOFTMAX}/",
                               [(f"{c.id}/{eq.name}", eq.latex or to_latex(eq.formula))
                                for c in built_site["contracts"] for eq in c.equations.values()])
    finally:
        browser.close()
    assert not bad_tex, f"KaTeX rejects equations: {bad_tex}"
    with capsys.disabled():
        print(f"\nscreenshots: {sm['shot']} ({sm['height']} px), {ix['shot']} ({ix['height']} px)")

    assert 'class="katex"' in sm["html"], "KaTeX did not render the equations"
    assert sm["katex"] >= 1
    assert "katex-error" not in sm["html"], "KaTeX reported a LaTeX error"
    for name, r in (("softmax page", sm), ("index page", ix)):
        assert r["mermaid_hosts"] >= 1, f"{name}: no mermaid block rendered"
        assert r["mermaid_svgs"] == r["mermaid_hosts"], f"{name}: a mermaid block has no <svg>"
        assert r["mermaid_pending"] == 0, f"{name}: a mermaid fence was never processed"
        remote = [u for u in r["requests"]
                  if not u.startswith((server + "/", "data:", "blob:", "about:"))]
        assert not remote, f"{name}: requests left the machine: {remote}"
        assert not r["failed"], f"{name}: requests failed: {r['failed']}"
        assert not r["bad_status"], f"{name}: missing assets: {r['bad_status']}"
        assert r["shot"].stat().st_size > 10_000
    # the live statuses from the coverage object are on the page
    assert "fs-covered" in sm["html"] and "fs-failed" in sm["html"]
    # every label of the dependency graphs is readable at 1280 px, not shrunk to fit a row
    (overview,) = ix["labels"]
    drawn = {lab["text"] for lab in overview["labels"]}
    assert len(drawn) >= 20, f"the index diagram draws {sorted(drawn)}"
    for name, diagrams in [("index", ix["labels"])] + [(k, v["labels"]) for k, v in focus.items()]:
        for d in diagrams:
            small = [(lab["text"], round(lab["font_px"], 1)) for lab in d["labels"]
                     if lab["font_px"] < MIN_LABEL_PX]
            assert not small, (f"{name}: labels under {MIN_LABEL_PX} px at 1280 px (diagram "
                               f"scaled by {d['scale']:.2f}): {small}")


# The matrix as a reader sees it: every column inside the content area (no sideways scroll), no
# cell's text clipped, cell text at least MIN_LABEL_PX, and every cell a link to a section that
# exists on the page.
MEASURE_MATRIX = """function () {
  const table = document.querySelector("article table");
  if (!table) return null;
  const area = table.closest(".md-typeset__scrollwrap") || table.parentElement;
  const cells = [...table.querySelectorAll("td, th")];
  const links = [...table.querySelectorAll("td a")].map((a) => a.getAttribute("href"));
  return {
    rows: table.querySelectorAll("tbody tr").length,
    table_px: table.getBoundingClientRect().width,
    area_px: area.clientWidth,
    scroll_px: area.scrollWidth,
    min_font_px: Math.min(...cells.map((c) => parseFloat(getComputedStyle(c).fontSize))),
    clipped: cells.filter((c) => c.scrollWidth > c.clientWidth + 1).map((c) => c.textContent),
    missing: links.filter((h) => h.startsWith("#") && !document.getElementById(h.slice(1))),
  };
}"""


def test_the_conformance_matrix_is_readable_at_1280_px(built_site, server):
    data = conformance_ledger.load(CONFORMANCE)
    tmp = built_site["tmp"]
    browser = Chromium(find_chromium(), tmp / "profile-conformance", tmp / "chromium-c.log")
    try:
        page = inspect_page(browser, f"{server}/contracts/conformance/", tmp / "conformance.png",
                            want_math=False, diagrams=False, evaluate=MEASURE_MATRIX)
    finally:
        browser.close()
    m = page["evaluated"]
    assert m, "no matrix table on the conformance page"
    assert m["rows"] == len(data["bindings"]), m
    assert m["scroll_px"] <= m["area_px"] + 1, f"the matrix scrolls sideways at 1280 px: {m}"
    assert not m["clipped"], f"cells clipped: {m['clipped'][:10]}"
    assert m["min_font_px"] >= MIN_LABEL_PX, m
    assert not m["missing"], f"cell links to no section: {m['missing'][:10]}"
    assert not page["failed"] and not page["bad_status"], (page["failed"], page["bad_status"])
