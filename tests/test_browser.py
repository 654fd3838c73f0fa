"""A real browser runs notebook 00 (issue 8): JupyterLab on a free local port, Debian's
chromium driven headless by Playwright. It runs every cell but the last, moves the
worker-count slider (ddnb.viz.WorkerCountExplorer) from 4 to 3 workers while the cluster
is up (after answering exercise 3 wrongly, reading the checker's hint, and answering it right), checks that the widget measured again and redrew, runs the last cell (which stops
the cluster), and checks that no cell shows an error and that no process is left.

    .venv/bin/python -m pytest tests/test_browser.py -v -s

The screenshot is kept in test-artifacts/. Skipped, with the reason, where the browser
(/usr/bin/chromium, which scripts/setup.sh installs with apt-get where it can) or the
playwright package is missing; DDNB_CHROMIUM=/path/to/chromium picks another binary
(a path that does not exist shows the skip).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "00_getting_started.ipynb"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("DDNB_CHROMIUM", "/usr/bin/chromium")
# Playwright gives chromium a fresh user-data-dir; the networking flags keep it from
# calling home (those connections are refused on a closed network, and only slow it down).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# JupyterLab settings for the test's server only (JUPYTERLAB_SETTINGS_DIR): every cell stays
# in the DOM, and no news or update check.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}
STDERR = 'application/vnd.jupyter.stderr'
# an error output, as JupyterLab renders it (a traceback, or IPython's short form for a
# SyntaxError), or a %%px error from the engines
ERROR = re.compile(r"Traceback|^\s*\w*(Error|Exception)\b|\[\d+:execute\]", re.MULTILINE)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(480)]


def _skip_reason() -> str | None:
    if not Path(CHROMIUM).is_file():
        return (f"browser test skipped: no chromium at {CHROMIUM} (Debian: apt-get install chromium; "
                "scripts/setup.sh does it where it runs as root)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "browser test skipped: the playwright package is not installed (pip install -e '.[dev]')"
    return None


def _wait(condition, timeout: float, what: str, interval: float = 0.5, every=None):
    """Poll `condition()` until it returns something truthy; fail naming `what` after
    `timeout` seconds. `every()`, if given, is called before each poll."""
    deadline = time.monotonic() + timeout
    while True:
        if every is not None:
            every()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kind(p: psutil.Process) -> str:
    """What a process runs, in a word: the module of `python -m module`, else the program."""
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return "(exited)"
    if len(cmd) > 2 and cmd[1] == "-m":
        return cmd[2]
    return Path(cmd[0]).name if cmd else "(exited)"


class Lab:
    """A `jupyter lab` server from this venv, serving a directory, with its own settings,
    workspaces and runtime dirs; `tree()` remembers every process under it."""

    def __init__(self, root: Path, home: Path):
        self.root, self.token = root, secrets.token_hex(16)
        self.seen, self.kinds = {}, {}   # pid -> psutil.Process, and what it runs
        for name, value in LAB_SETTINGS.items():
            path = home / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))
        # IPYTHONDIR: ipyparallel's cluster files of its own, so that JupyterLab's ipyparallel
        # extension does not act on the stale files of clusters killed elsewhere on this machine
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
                   IPYTHONDIR=str(home / "ipython"))
        self.log_path = home / "lab.log"
        for attempt in range(3):   # the free port can be taken between bind and listen
            self.port = _free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
                    "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                    f"--ServerApp.root_dir={root}"] + (["--allow-root"] if os.getuid() == 0 else [])
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(args, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
            self.seen[self.proc.pid], self.kinds[self.proc.pid] = psutil.Process(self.proc.pid), "jupyterlab"
            try:
                _wait(self._ready, 60, f"JupyterLab to answer on {self.url}")
                return
            except AssertionError:
                if self.proc.poll() is None or attempt == 2:
                    self.kill()
                    raise AssertionError(f"JupyterLab did not start:\n{self.log()}") from None

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"JupyterLab exited with {self.proc.returncode}")
        try:
            return self.api("GET", "/api/status", timeout=2) is not None
        except OSError:
            return False

    def api(self, method: str, path: str, timeout: float = 10):
        request = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else {}

    def log(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def tree(self) -> list:
        """The server and every process under it now (kernel, ipcontroller, engines),
        remembered for `left()`."""
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                if p.pid not in self.seen:
                    self.seen[p.pid], self.kinds[p.pid] = p, _kind(p)
        except psutil.NoSuchProcess:
            pass
        return list(self.seen.values())

    def left(self) -> list:
        """The processes seen under the server that still run (zombies count as gone)."""
        alive = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        return alive

    def shutdown(self) -> None:
        """Shut every kernel down, then the server, through the REST API."""
        self.tree()
        for kernel in self.api("GET", "/api/kernels"):
            self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout=30)
        self.api("POST", "/api/shutdown")
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        """Whatever is left of what this test started, killed (a failed test's clean-up)."""
        self.tree()
        for p in self.left():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)


@pytest.fixture
def lab(tmp_path):
    if reason := _skip_reason():
        pytest.skip(reason)
    served = tmp_path / "notebooks"   # JupyterLab saves into it, never into the repository
    served.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, served / NOTEBOOK)
    server = Lab(served, tmp_path)
    try:
        yield server
    finally:
        server.kill()


# --- the page --------------------------------------------------------------------------

def _texts(selector: str) -> str:
    return f"() => [...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)"


WRONG_ANSWER = "def total_over_ranks(value):\n    return float(value)   # no communication"
PROMPTS = _texts(".jp-Notebook .jp-CodeCell .jp-InputArea-prompt")   # "[7]:", "[*]:" or "[ ]:"
STDERR_TEXTS = _texts(f'.jp-Notebook [data-mime-type="{STDERR}"]')


def _errors(page) -> list[str]:
    return [text[:2000] for text in page.evaluate(STDERR_TEXTS) if ERROR.search(text)]


def _ran(page, cells: int) -> bool:
    """The first `cells` code cells show an execution count ("[7]:"), and none has failed."""
    if errors := _errors(page):
        raise AssertionError("a cell shows an error:\n" + "\n---\n".join(errors))
    prompts = page.evaluate(PROMPTS)
    return len(prompts) >= cells and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts[:cells])


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel",
                 has_text=re.compile(f"^{re.escape(item)}$")).click()


def test_notebook_00_runs_in_a_browser_and_the_slider_remeasures(lab):
    from playwright.sync_api import sync_playwright

    started = time.monotonic()
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "browser-00_getting_started.png"
    failed = screenshot.with_name("browser-00_getting_started-failed.png")
    for old in (screenshot, failed):   # none from an earlier run may pass for this one's
        old.unlink(missing_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(30_000)
        try:
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}", wait_until="domcontentloaded")
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=90_000)
            n_code = sum(c["cell_type"] == "code" for c in json.loads((lab.root / NOTEBOOK).read_text())["cells"])
            _wait(lambda: len(page.evaluate(PROMPTS)) == n_code, 30, f"the notebook's {n_code} code cells to show")
            print(f"\nJupyterLab {lab.url} up, kernel idle after {time.monotonic() - started:.0f} s; "
                  f"{n_code} code cells")

            # every cell above the last one, which stops the cluster
            last = page.locator(".jp-Notebook .jp-CodeCell").last
            last.locator(".jp-InputPrompt").click()
            _menu(page, "Run", "Run All Above Selected Cell")
            # lab.tree() on every poll: the engines that the sweep's resizes stop are counted too
            _wait(lambda: _ran(page, n_code - 1), 240, f"the first {n_code - 1} code cells to run", every=lab.tree)
            print(f"cells 1..{n_code - 1} ran after {time.monotonic() - started:.0f} s")

            # an exercise as a learner does it: a wrong answer, the checker's hint, then a right one
            answer, checker = (page.locator(".jp-Notebook .jp-CodeCell", has=page.locator(".cm-content", has_text=t))
                               for t in ("def total_over_ranks", "check_sum_over_ranks(total_over_ranks"))
            right = answer.locator(".cm-content").inner_text()
            for code, expect in ((WRONG_ANSWER, "returned its own value: the values must travel"),
                                 (right, "✓ check_sum_over_ranks")):
                answer.locator(".cm-content").click()
                page.keyboard.press("Control+A")
                page.keyboard.insert_text(code)          # no key events: no auto-indent
                page.keyboard.press("Control+Enter")     # run the cell, stay on it
                checker.locator(".jp-InputPrompt").click()
                page.keyboard.press("Control+Enter")
                _wait(lambda: expect in checker.locator(".jp-OutputArea").inner_text(), 90,
                      f"the checker to say {expect!r}", every=lab.tree)
            print("exercise 3: a wrong answer got its hint, the right one passed")

            # the slider: 4 workers -> 3, with the cluster up
            explorer = page.locator(".jp-Notebook .widget-vbox", has=page.locator(".widget-hslider")).first
            slider, status, image = (explorer.locator(".widget-hslider"),
                                     explorer.locator(".widget-label:not(.widget-description)").last,
                                     explorer.locator("img"))
            slider.scroll_into_view_if_needed()
            assert re.fullmatch(r"4 workers: [\d.]+ ms", status.inner_text().strip()), status.inner_text()
            image_before, readout = image.get_attribute("src"), slider.locator(".widget-readout")
            assert readout.inner_text().strip() == "4"
            slider.locator(".noUi-handle").focus()
            page.keyboard.press("ArrowLeft")
            _wait(lambda: re.fullmatch(r"3 workers: [\d.]+ ms", status.inner_text().strip()), 90,
                  "the widget's status to show a measurement with 3 workers", every=lab.tree)
            assert readout.inner_text().strip() == "3"
            _wait(lambda: image.get_attribute("src") != image_before, 30, "the widget's plot to be redrawn")
            print(f"slider moved to 3 workers: {status.inner_text().strip()!r}, plot redrawn")

            # the last cell stops the cluster
            last.locator(".jp-InputPrompt").click()
            page.keyboard.press("Control+Enter")
            _wait(lambda: _ran(page, n_code), 60, "the last cell (cluster.stop()) to run", every=lab.tree)
            stopped = last.locator(".jp-OutputArea-output").last.inner_text()
            assert "still running after stop(): 0" in stopped, stopped
            assert not _errors(page)
            explorer.scroll_into_view_if_needed()
            page.screenshot(path=screenshot)
            print(f"screenshot: {screenshot}")
        except BaseException:   # also pytest-timeout's
            try:
                page.screenshot(path=failed, timeout=10_000)
                print(f"screenshot of the failure: {failed}")
            except Exception as e:  # noqa: BLE001 - the test's own error matters more
                print(f"no screenshot of the failure ({type(e).__name__})")
            print(f"JupyterLab's log (end):\n{lab.log()}")
            raise
        finally:
            browser.close()

    lab.shutdown()
    deadline = time.monotonic() + 30   # the engines exit once they see the controller gone
    while (left := lab.left()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"still running after the shutdown: {[(p.pid, p.name()) for p in left]}"
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(Counter(lab.kinds.values()).items()))
    print(f"kernel and server shut down; none of the {len(lab.seen)} processes seen under the server is left "
          f"({kinds}); {time.monotonic() - started:.0f} s in all")
