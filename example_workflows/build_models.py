"""Regenerates the model workflow (vae_decode_anydevice): UI format, API twin and thumbnail, with
example_workflows/build.py's graph writer.

    python3 example_workflows/build_models.py            # from the repository root

The workflow uses ComfyUI's own VAELoader, VAEEncode and VAEDecode, so the headless runner cannot run
it (it says "run this workflow inside ComfyUI"); tests/e2e/test_model_e2e.py runs it in a real ComfyUI server
with a VAE made from ComfyUI's SD1.x config with random weights under the name below. The thumbnail is
the bundled photo: what an encode/decode round trip through a real SD VAE gives back (the random-weight
VAE of the tests gives noise).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: the VAE file the bundled workflow names (the e2e test makes it: SD1.x config, random weights)
VAE_FILE = "anydevice_random_sd15_vae.safetensors"


if str(HERE) not in sys.path:  # loaded by path (the tests): build.py beside this file
    sys.path.insert(0, str(HERE))
import build as B  # noqa: E402  (the graph writer, one module shared with the other generators)

# the ComfyUI core nodes this workflow uses: (widget names, defaults, outputs, socket inputs)
B.CORE.setdefault("VAELoader", (["vae_name"], [VAE_FILE], [("VAE", "VAE")], []))
B.CORE.setdefault("VAEEncode", ([], [], [("LATENT", "LATENT")], [("pixels", "IMAGE"), ("vae", "VAE")]))
B.CORE.setdefault("VAEDecode", ([], [], [("IMAGE", "IMAGE")], [("samples", "LATENT"), ("vae", "VAE")]))

#: the saved view: four columns fit a 1600x1000 window at this zoom
DS = {"scale": 0.75, "offset": [30, 40]}
#: node id -> (pos, size), laid out by hand: the Vue node renderer (frontend 1.27) draws nodes up to ~430
#: units wide and Load Image ~640 tall, so the columns are 460 apart and Load Image comes last in its column
LAYOUT = {1: ([40, 300], [310, 330]), 2: ([40, 60], [310, 90]), 3: ([500, 60], [310, 100]),
          4: ([500, 260], [310, 90]), 5: ([960, 60], [310, 70]), 6: ([960, 260], [310, 70]),
          7: ([1420, 60], [310, 330])}


def graphs() -> list:
    G = B.Graph
    g = G("vae_decode_anydevice",
          "VAE on AnyDevice: Load VAE as usual, pass the VAE through 'VAE on AnyDevice' (its decoder and encoder then "
          "run on the backend the DeviceSelect picks: OpenCL, CUDA, NumPy...), and use it with VAE Encode and VAE "
          "Decode. Here the photo is encoded and decoded again. Pick your own VAE file in Load VAE (an SD1.x/SDXL "
          f"VAE); {VAE_FILE} is the random-weight SD1.x VAE the tests make. The first run compiles (slow).")
    img = g.add("LoadImage", image="photo.png", col=0)
    vae = g.add("VAELoader", vae_name=VAE_FILE, col=0, row=1)
    dev = g.add("AnyDeviceDeviceSelect", device="auto", col=1)
    avae = g.add("AnyDeviceVAE", vae=vae[0], device=dev[0], col=1, row=1)
    lat = g.add("VAEEncode", pixels=img[0], vae=avae[0], col=2)
    dec = g.add("VAEDecode", samples=lat[0], vae=avae[0], col=2, row=1)
    g.add("SaveImage", images=dec[0], filename_prefix="anydevice_vae", col=3)
    return [g]


def main() -> int:
    for g in graphs():
        ui_path = HERE / f"{g.name}.json"
        made = g.ui()
        fresh = {"nodes": [{"id": n["id"], "type": n["type"], "pos": LAYOUT[n["id"]][0], "size": LAYOUT[n["id"]][1]}
                           for n in made["nodes"]], "extra": {"ds": DS}}
        layout = json.loads(ui_path.read_text()) if ui_path.exists() else fresh
        ui_path.write_text(json.dumps(g.ui(layout), indent=1) + "\n")
        (HERE / "api" / f"{g.name}.json").write_text(json.dumps(g.api(), indent=1) + "\n")
        B._thumbnail([], HERE / f"{g.name}.jpg")  # the photo: what a real VAE's round trip gives back
        print(f"wrote {g.name}.json, api/{g.name}.json, {g.name}.jpg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
