"""A JupyterLab server on loopback, and headless Chromium driven by Playwright, for the browser
tests: what a learner's browser shows, not what a kernel returns."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# Chromium as this machine's package manager installs it; Playwright drives it (no browser
# download). The flags keep it off the network: only loopback is reachable in CI.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ENV = "LABKIT_CHROMIUM"
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage")
INSTALL_HINT = ("install Chromium with the system package manager (`apt-get install chromium`, "
                "which `make setup` runs where it has root and apt) or point LABKIT_CHROMIUM at it")
# Environment a learner's kernel would not have: the test must see what they see.
CLEARED_ENV = ("TF_CPP_MIN_LOG_LEVEL", "LABKIT_PROGRESS", "LABKIT_NO_PROGRESS", "LABKIT_KERNEL_LOG",
               "LABKIT_KERNEL_STDERR", "JPY_SESSION_NAME", "MPLBACKEND")


def find_chromium() -> tuple[str | None, str]:
    """(path of a Chromium binary, "") or (None, why not, in one line)."""
    forced = os.environ.get(CHROMIUM_ENV)
    if forced:
        return (forced, "") if os.access(forced, os.X_OK) else (None, f"{CHROMIUM_ENV}={forced} is not an executable")
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path, ""
    return None, "Chromium not found: " + INSTALL_HINT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    """A running `jupyter lab` serving `root` on 127.0.0.1 with a token."""

    process: subprocess.Popen
    url: str
    token: str
    root: Path
    log: Path

    def page_url(self, notebook: str) -> str:
        # `reset` starts from an empty workspace: only this notebook opens.
        return f"{self.url}/lab/tree/{notebook}?reset&token={self.token}"

    def children_cpu_seconds(self) -> float | None:
        """CPU seconds used by the server's finished children (kernels, and what they started
        and waited for): a measure of a notebook's work that other load on the machine does
        not inflate as much as wall time. None where /proc is missing."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        cutime, cstime = int(fields[13]), int(fields[14])  # stat fields 16 and 17
        return (cutime + cstime) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_lab(root: Path, state: Path, *, repo: Path, artifacts: Path, timeout_s: float = 120) -> LabServer:
    """Start JupyterLab on `root` (notebooks to open), its settings and runtime files under
    `state`, kernels importing labkit from `repo` and writing under `artifacts`."""
    token = secrets.token_hex(16)
    port = _free_port()
    settings = state / "settings"
    # Every cell stays in the page (no virtual scrolling), so its outputs can be inspected.
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text('{"windowingMode": "none"}')
    # No "get notified about Jupyter news?" toast over the page (and no request for news).
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text('{"fetchNews": "false"}')
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH")) if p),
        "LABKIT_ARTIFACTS": str(artifacts),
        # Only this environment's kernels and settings: nothing from the user's home.
        "JUPYTER_CONFIG_DIR": str(state / "config"),
        "JUPYTER_DATA_DIR": str(state / "data"),
        "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
        "IPYTHONDIR": str(state / "ipython"),
    })
    log = state / "jupyterlab.log"
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True", f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={state / 'workspaces'}",
            "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly"]
    if os.geteuid() == 0:  # CI runs as root
        argv.append("--allow-root")
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT)
    server = LabServer(process, f"http://127.0.0.1:{port}", token, root, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/api/status?token={token}", timeout=5):
                return server
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"jupyter lab did not answer within {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")
