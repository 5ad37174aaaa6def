"""A real ComfyUI server for the end-to-end and browser tests.

Where ComfyUI is: ``COMFYUI_DIR`` when set (``COMFYUI_DIR=none`` turns the e2e tests off), else the
first of these that is a ComfyUI checkout with a venv: the ComfyUI this pack is installed in (the pack
at ``ComfyUI/custom_nodes/<pack>``), a ``ComfyUI`` folder beside the repository, ``/opt/ComfyUI``,
``~/ComfyUI``. The venv is ``venv`` (or ``.venv``) inside the checkout, or ``COMFYUI_PYTHON``. Without
one the tests skip and say why. The server runs from that venv on 127.0.0.1 with a free port and
``--cpu``; the pack is linked as ``<tmp>/custom_nodes/anydevice`` (an extra-model-paths yaml adds that
folder, and throwaway ``models/vae`` and ``models/checkpoints`` folders for :func:`write_random_vae` and
:func:`write_random_sd15_checkpoint`, so the ComfyUI checkout is never touched), input/output/temp/user
folders are throwaway ones, and only this pack is allowed (``--disable-all-custom-nodes
--whitelist-custom-nodes anydevice``), with ComfyUI-GGUF beside it where :func:`comfyui_gguf_dir` finds it.

Frontends: the one the checkout pins (its venv's ``comfyui-frontend-package``) and any other found by
:func:`frontends` (``COMFYUI_FRONTEND_ROOTS``, or ``comfyui-frontend-*`` folders made with
``pip install --target``), served with ``--front-end-root``. One server per frontend serves every test
module in the pytest process; they stop at exit.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from repo_paths import ROOT  # noqa: E402
PACK_NAME = "anydevice"
CITY96 = "ComfyUI-GGUF"  # the other pack the servers load where it is found (comfyui_gguf_dir)
PHOTO = ROOT / "example_workflows" / "input" / "photo.png"
ARTIFACTS = ROOT / "test-artifacts"
API = ROOT / "example_workflows" / "api"
#: the VAE file example_workflows/api/vae_decode_anydevice.json loads (made by write_random_vae)
RANDOM_VAE = "anydevice_random_sd15_vae.safetensors"
#: the SD1.5 checkpoint tests/e2e/test_sd15_e2e.py loads (made by write_random_sd15_checkpoint)
RANDOM_SD15 = "anydevice_random_sd15.safetensors"


def start_and_join(threads, timeout: float) -> list[str]:
    """Start ``threads`` and join them all within ``timeout`` seconds in total (a hang guard: they
    should be daemons); the names of those still running."""
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def finishes(fn, timeout: float = 120.0):
    """fn() in a thread joined with a timeout: a hang guard (the thread is a daemon, so a loop that
    never ends fails the test instead of the whole run). fn's value is returned, its exception raised."""
    out = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"did not finish within {timeout} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _venv_python(d: Path) -> Path | None:
    env = os.environ.get("COMFYUI_PYTHON", "").strip()
    if env:
        return Path(env) if Path(env).exists() else None
    for v in ("venv", ".venv"):
        p = d / v / "bin" / "python"
        if p.exists():
            return p
    return None


def comfy_candidates() -> list[Path]:
    """Conventional places of a ComfyUI checkout, in the order they are tried."""
    out = []
    if ROOT.parent.name == "custom_nodes":  # installed inside ComfyUI
        out.append(ROOT.parent.parent)
    out += [ROOT.parent / "ComfyUI", Path("/opt/ComfyUI"), Path.home() / "ComfyUI"]
    return out


def comfy_dir() -> tuple[Path | None, str]:
    """(ComfyUI dir, "") or (None, the reason the e2e tests skip)."""
    d = os.environ.get("COMFYUI_DIR", "").strip()
    if d.lower() in ("none", "off", "0", "no"):
        return None, f"COMFYUI_DIR={d}: the end-to-end tests are turned off"
    if d:
        p = Path(d)
        if not (p / "main.py").is_file():
            return None, f"COMFYUI_DIR={d} has no main.py"
        if _venv_python(p) is None:
            return None, f"COMFYUI_DIR={d} has no venv/bin/python (or set COMFYUI_PYTHON)"
        return p, ""
    for p in comfy_candidates():
        if (p / "main.py").is_file() and _venv_python(p) is not None:
            return p, ""
    return None, ("no ComfyUI found: set COMFYUI_DIR to a ComfyUI checkout with a venv at $COMFYUI_DIR/venv "
                  "(looked in " + ", ".join(str(p) for p in comfy_candidates()) + ")")


def comfyui_gguf_dir(comfy: Path | None) -> tuple[Path | None, str]:
    """(ComfyUI-GGUF checkout, "") or (None, why not): ``COMFYUI_GGUF_DIR``, else
    ``<ComfyUI>/custom_nodes/ComfyUI-GGUF``; it needs the gguf package in ComfyUI's venv."""
    env = os.environ.get("COMFYUI_GGUF_DIR", "").strip()
    cands = [Path(env)] if env else []
    if comfy is not None:
        cands.append(comfy / "custom_nodes" / "ComfyUI-GGUF")
    for c in cands:
        if (c / "ops.py").is_file() and (c / "loader.py").is_file():
            py = _venv_python(comfy) if comfy is not None else None
            if py is None or subprocess.run([str(py), "-c", "import gguf"], capture_output=True).returncode:
                return None, f"ComfyUI-GGUF at {c} needs the gguf package in ComfyUI's venv"
            return c, ""
    return None, ("ComfyUI-GGUF not found: set COMFYUI_GGUF_DIR to a checkout of github.com/city96/ComfyUI-GGUF "
                  "(looked in " + (", ".join(map(str, cands)) or "no place: no ComfyUI") + ")")


def run_in_comfy(comfy: Path, script: Path, *args, log_name: str, timeout: float = 900) -> dict:
    """Run a tests/support script under ComfyUI's own python (cwd: the checkout), its output kept in
    test-artifacts/<log_name>; the JSON of its last ``RESULT {...}`` line."""
    env = dict(os.environ, COMFYUI_DIR=str(comfy), PYTHONUNBUFFERED="1")
    env.pop("ANYDEVICE_BACKEND", None)
    proc = subprocess.run([str(_venv_python(comfy)), str(script), *map(str, args)], cwd=str(comfy), env=env,
                          capture_output=True, text=True, timeout=timeout)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / log_name).write_text(proc.stdout + "\n" + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _frontend_version(static: Path) -> str:
    """The comfyui-frontend-package version of a static folder (from its dist-info beside it)."""
    for info in sorted(static.parent.parent.glob("comfyui_frontend_package-*.dist-info")):
        return info.name[len("comfyui_frontend_package-"):-len(".dist-info")]
    return static.parent.name


def pinned_frontend(comfy: Path) -> str:
    """The frontend version the checkout's requirements.txt pins (what its server serves by default)."""
    try:
        for ln in (comfy / "requirements.txt").read_text().splitlines():
            if ln.strip().startswith("comfyui-frontend-package"):
                return ln.split("==", 1)[1].strip() if "==" in ln else ln.strip()
    except OSError:
        pass
    return "pinned"


def frontends(comfy: Path | None = None) -> list[tuple[str, Path | None]]:
    """[(version, --front-end-root or None)]: the checkout's pinned frontend first (None), then the
    static folders of other ``comfyui-frontend-package`` versions: ``COMFYUI_FRONTEND_ROOTS``
    (paths separated by ':'), else ``comfyui-frontend-*/comfyui_frontend_package/static`` in /opt, beside
    the ComfyUI checkout and beside the repository."""
    comfy = comfy or comfy_dir()[0]
    out: list[tuple[str, Path | None]] = [(pinned_frontend(comfy) if comfy else "pinned", None)]
    env = os.environ.get("COMFYUI_FRONTEND_ROOTS", "").strip()
    roots: list[Path] = []
    if env:
        roots = [Path(p) for p in env.split(":") if p.strip()]
    else:
        bases = {Path("/opt"), ROOT.parent}
        if comfy:
            bases.add(comfy.parent)
        for b in sorted(bases):
            roots += sorted(b.glob("comfyui-frontend-*/comfyui_frontend_package/static"))
    seen = {out[0][0]}
    for r in roots:
        if (r / "index.html").is_file():
            v = _frontend_version(r)
            if v not in seen:
                seen.add(v)
                out.append((v, r))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    def __init__(self, comfy: Path, front_end_root: Path | None = None):
        self.comfy = comfy
        self.front_end_root = front_end_root
        self.tmp = Path(tempfile.mkdtemp(prefix="anydevice_e2e_"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.tmp / "server.log"
        self.proc = None
        self.output_dir = self.tmp / "output"
        self.vae_dir = self.tmp / "models" / "vae"
        self.ckpt_dir = self.tmp / "models" / "checkpoints"

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 180.0) -> "ComfyServer":
        nodes = self.tmp / "custom_nodes"
        nodes.mkdir()
        (nodes / PACK_NAME).symlink_to(ROOT, target_is_directory=True)
        allowed = [PACK_NAME]
        self.comfyui_gguf = comfyui_gguf_dir(self.comfy)[0]
        if self.comfyui_gguf is not None:  # ComfyUI-GGUF's loaders, for tests/e2e/test_gguf_e2e.py
            (nodes / CITY96).symlink_to(self.comfyui_gguf, target_is_directory=True)
            allowed.append(CITY96)
        self.vae_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        (self.tmp / "extra_paths.yaml").write_text(f"anydevice_e2e:\n    custom_nodes: {nodes}\n"
                                                   f"    vae: {self.vae_dir}\n"
                                                   f"    checkpoints: {self.ckpt_dir}\n")
        for sub in ("input", "output", "temp", "user/default"):
            (self.tmp / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(PHOTO, self.tmp / "input" / "photo.png")
        (self.tmp / "user" / "default" / "comfy.settings.json").write_text(
            json.dumps({"Comfy.TutorialCompleted": True}))
        # --base-directory: custom_nodes (and models) are the throwaway folder's only, so a pack linked
        # into the checkout's own custom_nodes (another checkout of it, say) is not loaded beside this one
        cmd = [str(_venv_python(self.comfy)), "main.py", "--cpu", "--listen", "127.0.0.1",
               "--port", str(self.port), "--base-directory", str(self.tmp),
               "--user-directory", str(self.tmp / "user"),
               "--input-directory", str(self.tmp / "input"),
               "--output-directory", str(self.output_dir),
               "--temp-directory", str(self.tmp / "temp"),
               "--extra-model-paths-config", str(self.tmp / "extra_paths.yaml"),
               "--disable-all-custom-nodes", "--whitelist-custom-nodes", *allowed]
        if self.front_end_root:
            cmd += ["--front-end-root", str(self.front_end_root)]
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
                tag = f"_{self.front_end_root.parent.parent.name}" if self.front_end_root else ""
                shutil.copy(self.log_path, ARTIFACTS / f"comfyui_server{tag}.log")
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


def twin_class_types(name: str) -> set[str]:
    return {n["class_type"] for n in json.loads((API / f"{name}.json").read_text(encoding="utf-8")).values()}


def runnable_twins() -> list[str]:
    """The API twins the headless runner can run: every class type one of this pack's nodes or one of
    nodes/headless/core_nodes.CORE_NODES (the others, e.g. vae_decode_anydevice with ComfyUI's VAELoader, run
    only inside ComfyUI)."""
    from anydevice.nodes import NODE_CLASS_MAPPINGS
    from anydevice.nodes.headless.core_nodes import CORE_NODES
    known = set(NODE_CLASS_MAPPINGS) | set(CORE_NODES)
    return sorted(p.stem for p in API.glob("*.json") if twin_class_types(p.stem) <= known)


def write_random_vae(srv: "ComfyServer", timeout: float = 600) -> Path:
    """``RANDOM_VAE`` in the server's vae folder (once): ComfyUI's SD1.x VAE from its config with random
    weights, in ComfyUI's key layout (so VAELoader detects it), made by tests/support/model_nodes_comfy.py under
    the server's own python. Raises RuntimeError if it cannot be made."""
    path = srv.vae_dir / RANDOM_VAE
    if path.is_file():
        return path
    tmp = path.with_suffix(".part")
    env = dict(os.environ, COMFYUI_DIR=str(srv.comfy))
    proc = subprocess.run([str(_venv_python(srv.comfy)), str(ROOT / "tests" / "support" / "model_nodes_comfy.py"),
                           "--write-vae", str(tmp)], cwd=srv.comfy, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0 or not tmp.is_file():
        raise RuntimeError(f"could not make {RANDOM_VAE}: {proc.stderr[-3000:]}")
    tmp.replace(path)
    return path


def write_random_sd15_checkpoint(srv: "ComfyServer", timeout: float = 900) -> Path:
    """``RANDOM_SD15`` in the server's checkpoints folder (once per server, deleted with it): an
    SD1.5-architecture checkpoint (ComfyUI's UNet, CLIP-L and SD1.x VAE, random weights, float32, about
    4.3 GB) saved by ``comfy.sd.save_checkpoint``, made by tests/support/sd15_checkpoint_comfy.py under the
    server's own python (about a minute on two cores). Raises RuntimeError if it cannot be made."""
    path = srv.ckpt_dir / RANDOM_SD15
    if path.is_file():
        return path
    tmp = path.with_suffix(".part")
    env = dict(os.environ, COMFYUI_DIR=str(srv.comfy))
    try:
        proc = subprocess.run([str(_venv_python(srv.comfy)), str(ROOT / "tests" / "support" / "sd15_checkpoint_comfy.py"),
                               str(tmp)], cwd=srv.comfy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"could not make {RANDOM_SD15} in {timeout:.0f} s") from exc
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"could not make {RANDOM_SD15}: {proc.stderr[-3000:]}")
    tmp.replace(path)
    return path


def small_photo(srv: "ComfyServer", size: int = 64) -> str:
    """The photo scaled to size x size in the server's input folder (once); its name for LoadImage.
    The VAE workflow's server runs read it: a 64x64 image is an 8x8 latent, seconds on a CPU."""
    from PIL import Image
    name = f"photo_{size}.png"
    path = srv.tmp / "input" / name
    if not path.is_file():
        Image.open(PHOTO).convert("RGB").resize((size, size), Image.LANCZOS).save(path)
    return name


_servers: dict = {}
_failures: dict = {}


def server(front_end_root: Path | None = None) -> ComfyServer:
    """The shared server for a frontend (None: the checkout's pinned one), started on first use.
    Raises RuntimeError if it cannot start."""
    key = str(front_end_root or "")
    if key in _failures:
        raise RuntimeError(_failures[key])
    if key not in _servers:
        comfy, why = comfy_dir()
        if comfy is None:
            raise RuntimeError(why)
        try:
            _servers[key] = ComfyServer(comfy, front_end_root).start()
        except Exception as exc:  # noqa: BLE001
            _failures[key] = str(exc)
            raise
    return _servers[key]


def execution_error(history: dict):
    for name, data in history.get("status", {}).get("messages", []):
        if name == "execution_error":
            return data
    return None


# messages every page load has in this environment (see /opt/ComfyUI/SETUP_REPORT.md)
HARMLESS_CONSOLE = ("user.css", "/api/userdata", "api.comfy.org", "Cannot read properties of undefined (reading 'id')",
                    "Failed to load resource", "releases", "comfy.templates.json", "net::ERR_",
                    # newer frontends call routes the pinned server does not have (e.g. /api/jobs)
                    "JobsApiError", "Failed to fetch jobs", "/api/jobs")


def conv_train_prompt(size: int, images: int, lr: float, steps: int, batch_size: int) -> dict:
    """An API prompt that trains a 1x1 conv (3 channels, bias) to copy ``images`` EmptyImages of
    size x size, with SGD (momentum 0.9) and mse: nodes "1" to "4", the Train Network is "4"."""
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": size, "height": size, "batch_size": images,
                                                    "color": 0x336699}},
        "2": {"class_type": "AnyDeviceNetworkInput", "inputs": {"shape": f"3, {size}, {size}"}},
        "3": {"class_type": "AnyDeviceConvLayer", "inputs": {
            "out_channels": 3, "kernel_size": 1, "stride": 1, "padding": "same", "padding_size": 1,
            "padding_mode": "zeros", "dilation": 1, "groups": 1, "bias": True, "network": ["2", 0]}},
        "4": {"class_type": "AnyDeviceTrainNetwork", "inputs": {
            "loss": "mse", "optimizer": "sgd", "learning_rate": lr, "weight_decay": 0.0, "steps": steps,
            "epochs": 0, "batch_size": batch_size, "momentum": 0.9, "train_seed": 0, "network": ["3", 0],
            "inputs": ["1", 0], "targets": ["1", 0]}},
    }


def open_frontend(pg, url: str, vue: bool) -> None:
    """Opens the server's frontend at url in the Playwright page pg in the classic or the Vue node
    renderer: the renderer is a user setting the server keeps, so it is set either way, then the page
    starts afresh in it (asserted)."""
    pg.goto(url + "/")
    pg.wait_for_function("window.app && window.app.graph", timeout=120_000)
    pg.evaluate("async (on) => { await app.extensionManager.setting.set('Comfy.VueNodes.Enabled', on); }", vue)
    pg.reload()
    pg.wait_for_function("window.app && window.app.graph && window.comfyAPI && window.comfyAPI.api",
                         timeout=120_000)
    pg.wait_for_timeout(1500)
    assert pg.evaluate("() => !!app.extensionManager.setting.get('Comfy.VueNodes.Enabled')") == vue


def pack_console_errors(messages: list[str]) -> list[str]:
    """Console errors/page errors that are not the known harmless ones."""
    return [m for m in messages if not any(h in m for h in HARMLESS_CONSOLE)]
