"""Headless Chromium (Debian's ``chromium``) for the HTML report's browser test
(tests/report/test_html_report.py): driven over the DevTools protocol on a pipe (stdlib only: no
driver, no download), with every network request blocked and counted.

:func:`open_report` loads a page and returns what the test checks: console errors and exceptions,
requests that tried to leave the page, each panel's drawn size, marks and table rows, the served
table's K per range, a full-page screenshot and the size of the page printed to PDF."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

CHROMIUM = next((p for p in (os.environ.get("DSDPROF_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), shutil.which("google-chrome")) if p), None)
# the flags a closed network needs (no background fetches, no component updates), and a proxy that
# goes nowhere: whatever the page asked for beyond itself would fail, and is counted below
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-dev-shm-usage", "--disable-default-apps", "--mute-audio",
         "--hide-scrollbars",
         "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>", "--remote-debugging-pipe")


class Browser:
    """Chromium on a DevTools pipe (fd 3: commands in, fd 4: replies and events out, NUL-framed)."""

    def __init__(self, binary: str, timeout: float = 30.0):
        self.profile = tempfile.mkdtemp(prefix="dsdprof-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        self.log = open(Path(self.profile) / "chromium.log", "wb")  # noqa: SIM115 - closed in close()
        actions = [(os.POSIX_SPAWN_DUP2, cmd_r, 3), (os.POSIX_SPAWN_DUP2, out_w, 4),
                   (os.POSIX_SPAWN_DUP2, self.log.fileno(), 1), (os.POSIX_SPAWN_DUP2, self.log.fileno(), 2)]
        argv = [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        self.pid = os.posix_spawn(binary, argv, os.environ, file_actions=actions)
        os.close(cmd_r)
        os.close(out_w)
        self.timeout, self._buf, self._id, self.events = timeout, b"", 0, []

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                log = (Path(self.profile) / "chromium.log").read_text(errors="replace")
                raise RuntimeError("Chromium closed its pipe: " + log[-2000:])
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        for _ in range(50):
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        for fd in (self._cmd_w, self._out_r):
            os.close(fd)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


# What the page holds, read in the browser: each panel's drawn size and marks, the served table.
PAGE_STATE = r"""JSON.stringify({
  panels: [...document.querySelectorAll('section[data-panel]')].map(s => {
    const r = s.getBoundingClientRect();
    const svgs = [...s.querySelectorAll('svg.chart')];
    return {id: s.dataset.panel, width: r.width, height: r.height,
            text: s.innerText.trim().length,
            charts: svgs.map(g => ({w: g.getBoundingClientRect().width, h: g.getBoundingClientRect().height,
                                    marks: g.querySelectorAll('circle.mark, polyline').length})),
            tables: [...s.querySelectorAll('table')].map(t => t.querySelectorAll('tbody tr').length),
            missing: [...s.querySelectorAll('ul.missing li')].map(li => li.innerText)};
  }),
  ranges: [...document.querySelectorAll('#served-table tbody tr')].map(
    tr => [+tr.dataset.start, +tr.dataset.end, +tr.dataset.k]),
  heatmapBlank: [...document.querySelectorAll('td.hm')].filter(td => !td.innerText.trim()).length,
  untitled: [...document.querySelectorAll('td.hm, circle.mark')].filter(
    e => !(e.getAttribute('title') || (e.querySelector('title') || {}).textContent)).length,
  externals: [...document.querySelectorAll('[src], link[href], [href^="http"]')].map(
    e => e.getAttribute('src') || e.getAttribute('href')),
  kind: document.body.dataset.kind,
})"""


def open_report(browser: Browser, html: Path, shot: Path) -> dict:
    """Load ``html`` in a fresh tab with the network blocked; the page's state, the console errors,
    the requests that tried to leave, a full-page screenshot at ``shot`` and the PDF's size."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    s = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for m in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
        browser.send(m, session=s)
    browser.send("Network.setBlockedURLs", {"urls": ["http://*", "https://*", "ws://*", "wss://*", "ftp://*"]},
                 session=s)
    browser.send("Emulation.setDeviceMetricsOverride", {"width": 1366, "height": 800, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=s)
    browser.events.clear()
    browser.send("Page.navigate", {"url": html.resolve().as_uri()}, session=s)
    browser.wait_for("Page.loadEventFired")
    state = json.loads(browser.send("Runtime.evaluate", {"expression": PAGE_STATE, "returnByValue": True},
                                    session=s)["result"]["value"])
    size = browser.send("Page.getLayoutMetrics", session=s)["cssContentSize"]
    shot.write_bytes(base64.b64decode(browser.send("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": 1366, "height": min(size["height"], 16000), "scale": 1}},
        session=s)["data"]))
    pdf = base64.b64decode(browser.send("Page.printToPDF", {"printBackground": True}, session=s)["data"])
    errors = []
    for ev in browser.events:
        m, p = ev.get("method"), ev.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(f"console.{p['type']}: {p.get('args')}")
        elif m == "Runtime.exceptionThrown":
            errors.append(f"exception: {p['exceptionDetails'].get('text')}")
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
    requests = [ev["params"]["request"]["url"] for ev in browser.events
                if ev.get("method") == "Network.requestWillBeSent"
                and not ev["params"]["request"]["url"].startswith(("file:", "data:", "about:"))]
    browser.send("Target.closeTarget", {"targetId": target})
    return {**state, "errors": errors, "requests": requests, "pdf_bytes": len(pdf), "height": size["height"]}

