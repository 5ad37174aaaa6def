"""A real ComfyUI server for the end-to-end and browser tests.

``COMFYUI_DIR`` must point at a ComfyUI checkout with its venv at ``$COMFYUI_DIR/venv``. The server
runs from that venv on 127.0.0.1 with a free port and ``--cpu``; the pack is linked as
``<tmp>/custom_nodes/anydevice`` (an extra-model-paths yaml adds that folder, so the ComfyUI checkout
is never touched), input/output/temp/user folders are throwaway ones, and only this pack is allowed
(``--disable-all-custom-nodes --whitelist-custom-nodes anydevice``). One server serves every test
module in the pytest process; it stops at exit.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACK_NAME = "anydevice"
PHOTO = ROOT / "example_workflows" / "input" / "photo.png"
ARTIFACTS = ROOT / "test-artifacts"


def comfy_dir() -> tuple[Path | None, str]:
    """(ComfyUI dir, "") or (None, the reason the e2e tests skip)."""
    d = os.environ.get("COMFYUI_DIR", "").strip()
    if not d:
        return None, "COMFYUI_DIR is not set (point it at a ComfyUI checkout with a venv at $COMFYUI_DIR/venv)"
    p = Path(d)
    if not (p / "main.py").is_file():
        return None, f"COMFYUI_DIR={d} has no main.py"
    if not (p / "venv" / "bin" / "python").exists():
        return None, f"COMFYUI_DIR={d} has no venv/bin/python"
    return p, ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    def __init__(self, comfy: Path):
        self.comfy = comfy
        self.tmp = Path(tempfile.mkdtemp(prefix="anydevice_e2e_"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.tmp / "server.log"
        self.proc = None
        self.output_dir = self.tmp / "output"

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 180.0) -> "ComfyServer":
        nodes = self.tmp / "custom_nodes"
        nodes.mkdir()
        (nodes / PACK_NAME).symlink_to(ROOT, target_is_directory=True)
        (self.tmp / "extra_paths.yaml").write_text(f"anydevice_e2e:\n    custom_nodes: {nodes}\n")
        for sub in ("input", "output", "temp", "user/default"):
            (self.tmp / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(PHOTO, self.tmp / "input" / "photo.png")
        (self.tmp / "user" / "default" / "comfy.settings.json").write_text(
            json.dumps({"Comfy.TutorialCompleted": True}))
        cmd = [str(self.comfy / "venv" / "bin" / "python"), "main.py", "--cpu", "--listen", "127.0.0.1",
               "--port", str(self.port),
               "--user-directory", str(self.tmp / "user"),
               "--input-directory", str(self.tmp / "input"),
               "--output-directory", str(self.output_dir),
               "--temp-directory", str(self.tmp / "temp"),
               "--extra-model-paths-config", str(self.tmp / "extra_paths.yaml"),
               "--disable-all-custom-nodes", "--whitelist-custom-nodes", PACK_NAME]
        env = dict(os.environ)
        env.pop("ANYDEVICE_BACKEND", None)
        env["PYTHONUNBUFFERED"] = "1"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=self.comfy, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        atexit.register(self.stop)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                if self.get("/object_info/AnyDeviceConv2D", timeout=5):
                    self.started_in = time.time() - t0
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"ComfyUI did not answer within {timeout:.0f} s:\n{self.log()[-4000:]}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None) and not self._log.closed:
            self._log.close()
            try:  # keep the server log for a look after the run; drop the rest
                ARTIFACTS.mkdir(exist_ok=True)
                shutil.copy(self.log_path, ARTIFACTS / "comfyui_server.log")
            except OSError:
                pass
            shutil.rmtree(self.tmp, ignore_errors=True)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        try:
            return bool(self.get("/system_stats", timeout=10))
        except OSError:
            return False

    # ---- HTTP --------------------------------------------------------------------------------
    def get(self, path: str, timeout: float = 30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            data = r.read()
        return json.loads(data) if data[:1] in (b"{", b"[") else data

    def get_bytes(self, path: str, timeout: float = 30) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read()

    def post_prompt(self, prompt: dict, client_id: str | None = None) -> tuple[int, dict]:
        body = {"prompt": prompt}
        if client_id:
            body["client_id"] = client_id
        req = urllib.request.Request(self.url + "/prompt", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def wait_history(self, prompt_id: str, timeout: float = 180) -> dict:
        t0 = time.time()
        while time.time() - t0 < timeout:
            h = self.get(f"/history/{prompt_id}")
            if prompt_id in h:
                return h[prompt_id]
            if self.proc.poll() is not None:
                raise RuntimeError("ComfyUI died:\n" + self.log()[-4000:])
            time.sleep(0.2)
        raise TimeoutError(f"prompt {prompt_id} did not finish in {timeout} s")

    def run(self, prompt: dict, client_id: str | None = None) -> dict:
        code, r = self.post_prompt(prompt, client_id)
        if code != 200:
            raise AssertionError(f"POST /prompt -> {code}: {json.dumps(r)[:3000]}")
        return self.wait_history(r["prompt_id"])

    def view(self, image: dict) -> bytes:
        q = urllib.parse.urlencode({"filename": image["filename"], "subfolder": image.get("subfolder", ""),
                                    "type": image.get("type", "output")})
        return self.get_bytes("/view?" + q)


_server: ComfyServer | None = None
_failure: str | None = None


def server() -> ComfyServer:
    """The shared server (started on first use). Raises RuntimeError if it cannot start."""
    global _server, _failure
    if _failure:
        raise RuntimeError(_failure)
    if _server is None:
        comfy, why = comfy_dir()
        if comfy is None:
            raise RuntimeError(why)
        try:
            _server = ComfyServer(comfy).start()
        except Exception as exc:  # noqa: BLE001
            _failure = str(exc)
            raise
    return _server


def execution_error(history: dict):
    for name, data in history.get("status", {}).get("messages", []):
        if name == "execution_error":
            return data
    return None


# messages every page load has in this environment (see /opt/ComfyUI/SETUP_REPORT.md)
HARMLESS_CONSOLE = ("user.css", "/api/userdata", "api.comfy.org", "Cannot read properties of undefined (reading 'id')",
                    "Failed to load resource", "releases", "comfy.templates.json", "net::ERR_")


def pack_console_errors(messages: list[str]) -> list[str]:
    """Console errors/page errors that are not the known harmless ones."""
    return [m for m in messages if not any(h in m for h in HARMLESS_CONSOLE)]
