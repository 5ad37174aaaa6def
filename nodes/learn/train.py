"""Train, Apply, Save and Load Network, Layer Weights and Image Patches."""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
from pathlib import Path

import numpy as np
import torch

from ...backend import AnyDeviceError
from ...backend.learn import optim as _optim
from ...backend.learn.train import LOSSES as _TRAIN_LOSSES, one_target_per_input
from ...backend.system import cancel as _cancel
from ..base.common import ANY, DATA, DEVICE_INPUT, NodeError, Progress, Timer, badge, resolve_backend
from ..base.widgets import Bool, Choice, Float, Int, Text, outputs
from ..tensors.nodes import QUANTIZE
from .common import (CURVE_POINTS, LABELS, LOSS_MAP, NETWORK, SEED_MAX, _LearnNode, _NetworkNode, _TARGET_TYPES,
                           _host_ui, _labels, _layer_text, _net_error, _network, _shape_text, from_batch, model_dirs,
                           network_files, network_path, to_batch)

log = logging.getLogger("anydevice")


def _send(event: str, payload: dict) -> None:
    """A server event to the page (inside ComfyUI; nothing otherwise)."""
    server = sys.modules.get("server")
    ps = getattr(server, "PromptServer", None) if server is not None else None
    inst = getattr(ps, "instance", None) if ps is not None else None
    if inst is None:
        return
    try:
        inst.send_sync(event, payload, getattr(inst, "client_id", None))
    except Exception as exc:  # noqa: BLE001 - a page that is gone must not stop training
        log.debug("AnyDevice: %s event not sent: %s", event, exc)


def _thin(values: list[float], n: int = CURVE_POINTS) -> list[float]:
    if len(values) <= n:
        return [float(v) for v in values]
    idx = np.linspace(0, len(values) - 1, n).round().astype(int)
    return [float(values[i]) for i in idx]


LOSSES = list(_TRAIN_LOSSES)
OPTIMIZERS = list(_optim.OPTIMIZERS)


class AnyDeviceTrainNetwork(_LearnNode):
    DISPLAY = "Train Network (AnyDevice)"
    DESCRIPTION = ("Trains the network on inputs and targets on the chosen backend: mini-batches (shuffled with the "
                   "seed), the loss, backward through the pack's own autograd, and the optimizer. Same seed, backend "
                   "and thread count give the same weights bit for bit. The loss curve is drawn live on the node; "
                   "Cancel stops between steps. A loss that turns NaN/Inf stops the run with the last finite weights "
                   "(a warning on the node).")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        (NETWORK, "network", "The trained network (the input network is unchanged)."),
        (LOSS_MAP, "loss_map", "{'loss': [every step's loss]}: connect ComfyUI's Plot Loss Graph."),
        ("FLOAT", "final_loss", "The loss of the last step."))
    OUTPUT_NODE = True
    ARGS = {"lr": "learning_rate", "weight_decay": "weight_decay", "steps": "steps", "epochs": "epochs",
            "batch_size": "batch_size", "seed": "train_seed", "inputs": "inputs", "targets": "targets",
            "loss": "loss", "optimizer": "optimizer", "network": "network", "in_shape": "inputs",
            "momentum": "momentum"}

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "network": (NETWORK, {"tooltip": "The network to train (its weights are initialised from train_seed "
                                                 "when it has none)."}),
                "inputs": (DATA, {"tooltip": "A batch of training inputs: IMAGE, MASK, LATENT or TENSOR ((N, F) or "
                                             "(N, C, H, W))."}),
                "targets": (_TARGET_TYPES, {"tooltip": "What the network should output for each input: a batch of "
                                                       "the same kind, or class labels (Load Labeled Images) for "
                                                       "cross_entropy."}),
                "loss": Choice(LOSSES, "mse",
                               "The objective: mse, l1, smooth_l1, huber, bce, psnr (maximised), ssim (maximised) or "
                               "cross_entropy (class labels)."),
                "optimizer": Choice(OPTIMIZERS, "adam", "torch.optim's update rules."),
                "learning_rate": Float(0.001, 0.0, 10.0, 0.0001, "Step size (> 0).", round=False),
                "weight_decay": Float(0.0, 0.0, 10.0, 0.0001,
                                      "L2 penalty (adamw: decoupled weight decay).", round=False),
                "steps": Int(200, 1, 1000000, "Optimizer steps (used when epochs is 0)."),
                "epochs": Int(0, 0, 100000, "Passes over the data; 0 uses steps instead."),
                "batch_size": Int(16, 1, 65536, "Samples per step. 1 trains on one sample a step; batch norm "
                                                "on features needs 2 or more."),
                "momentum": Float(0.9, 0.0, 0.9999, 0.01, "sgd: momentum."),
                "train_seed": Int(0, 0, SEED_MAX,
                                  "Seed of the initial weights, the batch order and dropout. It does not change "
                                  "between runs, so a re-queue does not retrain."),
            },
            "optional": {"device": DEVICE_INPUT},
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def _run(self, network, inputs, targets, loss="mse", optimizer="adam", learning_rate=0.001, weight_decay=0.0,
             steps=200, epochs=0, batch_size=16, momentum=0.9, train_seed=0, device=None, unique_id=None):
        from ...backend.learn.train import train
        node = self.DISPLAY
        net = _network(network, node, required=True)
        if not net.layers:
            raise NodeError(node, "network", "an empty network", "has no layers: connect layer nodes")
        try:
            _optim.learning_rate(node, "learning_rate", learning_rate)
        except AnyDeviceError as exc:
            raise NodeError(node, "learning_rate", learning_rate, exc.reason) from None
        be = resolve_backend(device, node)
        x, _kind = to_batch(inputs, node, "inputs")
        labels = _labels(targets)
        if labels is not None:
            if loss != "cross_entropy":
                raise NodeError(node, "targets", f"class labels of shape {tuple(labels.shape)}",
                                f"class labels need the cross_entropy loss (loss is {loss})")
            y = labels
        else:
            y, _ = to_batch(targets, node, "targets")
        unpaired = one_target_per_input(x.shape[0], y.shape[0])
        if unpaired:
            raise NodeError(node, "targets", f"a batch of {y.shape[0]}", unpaired)
        if net.in_shape is not None and tuple(net.in_shape[1:]) != tuple(x.shape[1:]) and net.params is None:
            raise NodeError(node, "inputs", f"samples of shape {tuple(x.shape[1:])}",
                            f"the network's Network Input says {tuple(net.in_shape[1:])}")
        if net.params is None:
            net = dataclasses.replace(net, in_shape=None)  # initialised for the training batch by train()
        opt_params = {"momentum": float(momentum)} if optimizer == "sgd" else {}
        sid = None if unique_id is None else str(unique_id)
        bar = []
        pace = _cancel.Pacer()
        shown = [0]  # the last step reported

        def on_step(step, total, value):
            # reported by wall time (and at the last step), not every step: each report is several
            # server messages (bar, progress state, loss point), millions over a long run of short steps
            if not (pace.due() or step == total):
                return
            if not bar:  # ComfyUI's progress bar
                bar.append(Progress(total))
            bar[0].step(step - shown[0])
            shown[0] = step
            if sid is not None:
                _send("anydevice.train", {"node": sid, "step": int(step), "steps": int(total), "loss": float(value)})

        if sid is not None:
            _send("anydevice.train", {"node": sid, "step": 0, "steps": 0, "loss": None, "start": True})
        t = Timer()
        try:
            res = train(net, x, y, be=be, loss=loss, optimizer=optimizer, lr=float(learning_rate),
                        weight_decay=float(weight_decay), steps=None if epochs else int(steps),
                        epochs=int(epochs) or None, batch_size=int(batch_size), seed=int(train_seed),
                        on_step=on_step, optimizer_params=opt_params)
        except AnyDeviceError as exc:
            if exc.arg and str(exc.arg).startswith("layer "):
                raise _net_error(node, "network", exc) from exc
            raise
        ms = t.ms(be)
        ui = badge(be, ms, op="train", steps=res.steps)
        final = float(res.final_loss)
        lines = [f"{loss} {final:.6g} after {res.steps} steps ({optimizer}, lr {learning_rate:g})"]
        if res.stopped:
            ui["anydevice"][0]["warning"] = res.stopped
            lines.append(res.stopped)
        ui["text"] = lines
        ui["train_curve"] = [{"loss": _thin(res.losses), "steps": res.steps, "name": loss,
                              "stopped": res.stopped}]
        log.info("AnyDevice %s: %s", node, lines[0])
        return {"ui": ui, "result": (res.network, {"loss": [float(v) for v in res.losses]}, final)}


# =================================================================================================
class AnyDeviceApplyNetwork(_LearnNode):
    DISPLAY = "Apply Network (AnyDevice)"
    DESCRIPTION = ("Runs the network (evaluation mode) on an input and returns the same type (IMAGE in, IMAGE out) "
                   "where the output's shape fits it, else a TENSOR (e.g. class scores). For class scores it also "
                   "gives the predicted labels, and with the true labels connected the accuracy.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        (ANY, "output", "The network's output, of the input's type where it fits."),
        (LABELS, "predicted", "argmax over dim 1 (the classes), as labels."),
        ("FLOAT", "accuracy", "Fraction of predicted labels equal to the connected labels (0 without labels)."))
    OUTPUT_NODE = True
    ARGS = {"input": "input", "inputs": "input"}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"network": (NETWORK, {"tooltip": "A trained (or loaded) network."}),
                             "input": (DATA, {"tooltip": "IMAGE, MASK, LATENT or TENSOR batch."}),
                             "batch_size": Int(256, 1, 65536, "Samples per forward pass.")},
                "optional": {"labels": (LABELS, {"tooltip": "True class labels: the accuracy is computed."}),
                             "device": DEVICE_INPUT,
                             "weights": Choice(QUANTIZE, "none",
                                               "Run the conv and linear layers with their weights quantized (q8_0, "
                                               "int8, q4_x, q5_x, float8), kept packed on the device; the network "
                                               "itself is not changed. none: as trained.")}}

    def _run(self, network, input, batch_size=256, labels=None, device=None, weights="none"):
        from ...backend.learn.train import predict
        node = self.DISPLAY
        net = _network(network, node, required=True)
        be = resolve_backend(device, node)
        x, kind = to_batch(input, node, "input")
        lines = []
        try:
            if net.params is None:
                net = net.initialized((1,) + tuple(x.shape[1:]), 0)
                lines.append("untrained network: initial weights (seed 0)")
            net.shapes((x.shape[0],) + tuple(x.shape[1:]))
        except AnyDeviceError as exc:
            raise _net_error(node, "network", exc) from exc
        pbar = Progress(1)
        t = Timer()
        if weights not in (None, "", "none") and weights not in QUANTIZE:
            raise NodeError(node, "weights", weights, f"must be one of {', '.join(QUANTIZE)}")
        try:
            y = predict(net, be, x, batch_size=int(batch_size), weights=weights)
        except AnyDeviceError as exc:
            if exc.op != "predict":
                raise
            raise NodeError(node, "weights", weights, exc.reason) from exc
        ms = t.ms(be)
        pbar.step()
        out = from_batch(y, kind, input)
        pred = torch.from_numpy(y.argmax(axis=1).astype(np.int64)) if y.ndim >= 2 else torch.zeros(y.shape[0], dtype=torch.int64)
        acc = 0.0
        if labels is not None:
            lab = _labels(labels)
            if lab is None:
                raise NodeError(node, "labels", type(labels).__name__, "must be class labels (an integer tensor)")
            if lab.shape != tuple(pred.shape):
                raise NodeError(node, "labels", f"shape {tuple(lab.shape)}",
                                f"must match the predictions' shape {tuple(pred.shape)}")
            hits = int((pred.numpy() == lab).sum())
            acc = hits / max(1, lab.size)
            lines.append(f"accuracy {100 * acc:.2f}% ({hits}/{lab.size})")
        lines.insert(0, f"output {_shape_text(y.shape)}" + ("" if weights in (None, "", "none")
                                                            else f", conv/linear weights as {weights}"))
        ui = badge(be, ms, op="forward", shape=list(y.shape))
        ui["text"] = lines
        if labels is not None:
            ui["accuracy"] = [acc]
        return {"ui": ui, "result": (out, pred, acc)}


# =================================================================================================
_NAME_OK = re.compile(r"^[\w\-. /]+$")


def _counted(path: Path) -> Path:
    """The next ``stem_00001_.safetensors`` beside ``path``, counting on from the highest there:
    ComfyUI's savers' scheme (its CheckpointSave: ``name_00001_.safetensors``)."""
    stem = os.path.normcase(path.name[: -len(".safetensors")])
    top = 0
    try:
        names = os.listdir(path.parent)
    except OSError:
        names = []
    for f in names:
        f = os.path.normcase(f)
        if f.startswith(stem + "_") and f.endswith("_.safetensors"):
            digits = f[len(stem) + 1: -len("_.safetensors")]
            if digits.isdigit():
                top = max(top, int(digits))
    return path.parent / f"{path.name[: -len('.safetensors')]}_{top + 1:05}_.safetensors"


class AnyDeviceSaveNetwork(_LearnNode):
    DISPLAY = "Save Network (AnyDevice)"
    DESCRIPTION = ("Saves the network (layers in the metadata, weights as tensors under torch's state-dict names) as "
                   "a .safetensors file in models/anydevice/. It never replaces a file unless overwrite is on: a "
                   "name that is taken gets a counter (name_00001_.safetensors), as ComfyUI's savers do.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs()  # none: it saves a file
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"network": (NETWORK, {"tooltip": "A trained network."}),
                             "filename": Text("anydevice_network",
                                              "File name in models/anydevice/ (.safetensors is added; a / makes "
                                              "subfolders). When that file exists it is kept and the network goes to "
                                              "the next name_00001_.safetensors, unless overwrite is on.")},
                "optional": {"overwrite": Bool(False,
                                               "Replace an existing file of that name. Off (the default): never "
                                               "replace a file; a taken "
                                               "name gets a counter, name_00001_.safetensors.")}}

    def _run(self, network, filename="anydevice_network", overwrite=False):
        from ...backend.learn import netio
        node = self.DISPLAY
        net = _network(network, node, required=True)
        if net.params is None:
            raise NodeError(node, "network", repr(net), "has no weights yet: train it first")
        name = str(filename).strip()
        if name.endswith(".safetensors"):
            name = name[: -len(".safetensors")]
        if not name or not _NAME_OK.match(name) or ".." in Path(name).parts or os.path.isabs(name):
            raise NodeError(node, "filename", filename, "must be a plain file name (letters, digits, - _ . /), "
                            "inside models/anydevice")
        base = model_dirs()[0]
        target = base / f"{name}.safetensors"
        for sub in reversed(list(Path(name).parents)[:-1]):  # the folders the name makes, outermost first
            if (base / sub).exists() and not (base / sub).is_dir():
                raise NodeError(node, "filename", filename, f"'{sub.as_posix()}' is a file in {base}, not a "
                                "folder: choose another name")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise NodeError(node, "filename", filename, f"cannot make the folder {target.parent}: "
                            f"{exc.strerror or exc}") from None
        if target.is_dir():
            raise NodeError(node, "filename", filename, f"is a folder in {base}: choose another name")
        path, replaced, reserved = target, target.exists(), False
        if not overwrite:
            replaced = False
            # claimed with an exclusive create (a file another save made meanwhile is never replaced)
            while True:
                try:
                    with open(path, "x"):
                        pass
                    reserved = True
                    break
                except FileExistsError:
                    path = _counted(target)
                except OSError as exc:
                    raise NodeError(node, "filename", filename, f"cannot write {path}: {exc.strerror or exc}") from None
        t = Timer()
        try:
            netio.save(net, path, metadata={"anydevice.in_shape": str(list(net.in_shape or []))})
        except AnyDeviceError as exc:
            if reserved:
                try:
                    path.unlink()
                except OSError:
                    pass
            raise NodeError(node, "filename", filename, exc.reason or str(exc)) from exc
        lines = [f"saved {path.name}", f"{net.num_params()} parameters"]
        if path != target:
            lines.insert(1, f"{target.name} exists: kept (overwrite is off)")
        elif replaced:
            lines.insert(1, "replaced the file of that name (overwrite is on)")
        log.info("AnyDevice %s: saved %s", node, path)
        ui = _host_ui(t.ms(), lines, "CPU (file)", path=str(path))
        return {"ui": ui, "result": ()}


class AnyDeviceLoadNetwork(_NetworkNode):
    DISPLAY = "Load Network (AnyDevice)"
    DESCRIPTION = "Loads a network saved by Save Network (or any safetensors file with the AnyDevice layer spec)."
    OUTPUT_TOOLTIPS = ("The network with its weights.",)

    @classmethod
    def INPUT_TYPES(cls):
        files = network_files()
        return {"required": {"name": (files or ["(no networks saved yet)"], {
            "tooltip": "A .safetensors file in models/anydevice/."})}}

    @classmethod
    def IS_CHANGED(cls, name):
        p = network_path(name)
        return p.stat().st_mtime if p is not None else ""

    def _run(self, name):
        from ...backend.learn import netio
        node = self.DISPLAY
        p = network_path(name)
        if p is None:
            raise NodeError(node, "name", name, f"no such file in {', '.join(str(d) for d in model_dirs())}")
        t = Timer()
        try:
            net = netio.load(p)
        except AnyDeviceError as exc:
            raise NodeError(node, "name", name, exc.reason or str(exc)) from exc
        lines = [f"{len(net.layers)} layers, {net.num_params()} parameters"]
        return {"ui": _host_ui(t.ms(), lines, "CPU (file)"), "result": (net,)}


# =================================================================================================
class AnyDeviceLayerWeights(_LearnNode):
    DISPLAY = "Layer Weights (AnyDevice)"
    DESCRIPTION = ("A trained layer's weight and bias as WEIGHTS, for the Conv2D and Linear nodes (kernel_source / "
                   "source 'weights'): the learned kernel then shows in their kernel grid. 'matrix' gives a 1x1 "
                   "conv's weight as the (out, in) matrix Linear takes.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(("WEIGHTS", "weights", "{weight, bias} of the layer."))
    SHAPES = ["as stored", "matrix"]

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "network": (NETWORK, {"tooltip": "A trained (or loaded) network."}),
            "layer": Int(-1, -1, 10000, "Index of the layer (the numbers the layer nodes show); -1: the first "
                                        "conv or linear layer."),
            "shape": Choice(cls.SHAPES, "as stored",
                            "as stored: conv (out, in/groups, kH, kW), linear (out, in); matrix: a 1x1 conv as (out, "
                            "in), for Linear.")}}

    def _run(self, network, layer=-1, shape="as stored"):
        node = self.DISPLAY
        net = _network(network, node, required=True)
        t = Timer()
        idx = int(layer)
        if idx < 0:
            idx = next((i for i, ly in enumerate(net.layers) if ly["type"] in ("conv2d", "linear")), None)
            if idx is None:
                raise NodeError(node, "network", repr(net), "has no conv or linear layer at its top level")
        elif idx >= len(net.layers):
            raise NodeError(node, "layer", idx, f"the network has {len(net.layers)} layers (0..{len(net.layers) - 1})")
        ly = net.layers[idx]
        if ly["type"] not in ("conv2d", "linear"):
            raise NodeError(node, "layer", idx, f"is layer {idx} ({ly['type']}): only conv and linear layers have "
                            "weights to use in Conv2D / Linear")
        if net.params is None:
            raise NodeError(node, "network", repr(net), "has no weights yet: train it (Train Network) or load one")
        w = torch.from_numpy(np.array(net.params[f"{idx}.weight"], np.float32))
        b = net.params.get(f"{idx}.bias")
        b = None if b is None else torch.from_numpy(np.array(b, np.float32))
        if shape == "matrix" and w.ndim == 4:
            if tuple(w.shape[2:]) != (1, 1) or ly["groups"] != 1:
                raise NodeError(node, "shape", shape, f"only a 1x1 conv with groups 1 is a matrix; layer {idx} "
                                f"has weight {tuple(w.shape)}")
            w = w.reshape(w.shape[0], w.shape[1])
        lines = [f"layer {idx}: {_layer_text(ly)}", f"weight {_shape_text(w.shape)}" +
                 ("" if b is None else f", bias {_shape_text(b.shape)}")]
        return {"ui": _host_ui(t.ms(), lines), "result": ({"weight": w, "bias": b},)}


# =================================================================================================
class AnyDeviceImagePatches(_LearnNode):
    DISPLAY = "Image Patches (AnyDevice)"
    DESCRIPTION = ("A training batch from images: seeded random square crops, and the same crops with seeded "
                   "Gaussian noise added (for denoisers). A patch_size as large as the image gives the image itself.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        ("IMAGE", "patches", "The crops, a batch [count, size, size, C]."),
        ("IMAGE", "noisy", "The crops plus noise (clamped to 0..1 if asked)."))

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "image": ("IMAGE", {"tooltip": "One image or a batch; crops come from random batch entries."}),
            "patch_size": Int(32, 1, 4096, "Crop height and width."),
            "count": Int(64, 1, 65536, "Number of crops."),
            "noise_std": Float(0.1, 0.0, 10.0, 0.01,
                               "Standard deviation of the Gaussian noise of the 'noisy' output."),
            "clamp": Bool(True, "Clamp the noisy crops to 0..1, as a saved image is."),
            "patch_seed": Int(0, 0, SEED_MAX, "Seed of the crop positions and the noise (fixed between runs)."),
        }}

    def _run(self, image, patch_size=32, count=64, noise_std=0.1, clamp=True, patch_seed=0):
        node = self.DISPLAY
        if not torch.is_tensor(image) or image.ndim != 4:
            raise NodeError(node, "image", type(image).__name__, "must be an IMAGE [B, H, W, C]")
        b, h, w, c = image.shape
        s = int(patch_size)
        if s > h or s > w:
            raise NodeError(node, "patch_size", s, f"is larger than the image ({h}x{w})")
        n = int(count)
        if n * s * s * c * 4 * 2 > (1 << 31):
            raise NodeError(node, "count", n, f"{n} patches of {s}x{s}x{c} would take over 2 GB")
        t = Timer()
        rng = np.random.default_rng(int(patch_seed) & ((1 << 64) - 1))
        src = image.detach().to("cpu", torch.float32).numpy()
        bi = rng.integers(0, b, n)
        ys = rng.integers(0, h - s + 1, n)
        xs = rng.integers(0, w - s + 1, n)
        patches = np.stack([src[i, y:y + s, x:x + s] for i, y, x in zip(bi, ys, xs)]).astype(np.float32)
        noisy = patches + rng.standard_normal(patches.shape).astype(np.float32) * np.float32(noise_std)
        if clamp:
            noisy = np.clip(noisy, 0.0, 1.0)
        ui = _host_ui(t.ms(), [f"{n} patches {s}x{s}, noise std {noise_std:g}"], "CPU (data)")
        return {"ui": ui, "result": (torch.from_numpy(patches), torch.from_numpy(noisy.astype(np.float32)))}
