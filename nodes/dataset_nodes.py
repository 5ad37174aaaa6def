"""Data set nodes: a labelled image folder (one subfolder per class) as an IMAGE batch and labels.

    digits/train/0/0000.png, digits/train/0/0010.png, ..., digits/train/9/1796.png

Classes are the subfolder names, sorted (as torchvision's ImageFolder: class i is the i-th name);
each class's files are read in sorted name order. A class folder with no image keeps its index (so
a train and a test folder with the same classes give the same labels). Files are read as
ComfyUI's image loaders read them (Pillow, EXIF orientation applied, 16-bit "I" images scaled,
converted to RGB, /255).
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch

from .common import NodeError, PackNode, Timer
from .helpers import _host_badge

log = logging.getLogger("anydevice")

#: the socket type of a labels value: a CPU torch int64 tensor [B] of class indices
LABELS = "ANYDEVICE_LABELS"
#: what counts as an image file (ComfyUI's image-set loaders' extensions)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".jpe", ".tif", ".tiff")
MAX_IMAGES = 1_000_000


def input_roots() -> list[Path]:
    """Where a relative folder is looked up: ComfyUI's input directory inside ComfyUI; otherwise
    the headless runner's input folders (./, ./input, the pack's example_workflows/input)."""
    fp = sys.modules.get("folder_paths")
    if fp is None and "comfy" in sys.modules:
        try:
            import folder_paths as fp  # noqa: PLC0415 - only inside ComfyUI
        except ImportError:
            fp = None
    if fp is not None and hasattr(fp, "get_input_directory"):
        # ComfyUI's input folder first; then the pack's own bundled inputs, so the bundled
        # templates (the digits) run without copying anything
        bundled = Path(__file__).resolve().parent.parent / "example_workflows" / "input"
        return [Path(fp.get_input_directory()).resolve(), bundled]
    from .core_nodes import input_folders  # noqa: PLC0415 - core_nodes imports the node table
    return input_folders(None)


def resolve_folder(folder, node: str) -> Path:
    """The folder ``folder`` names: absolute as given; relative inside an input folder (never
    leaving it with '..')."""
    if not isinstance(folder, str) or not folder.strip():
        raise NodeError(node, "folder", folder, "must name a folder (relative to ComfyUI's input folder, or absolute)")
    name = folder.strip()
    if os.path.isabs(name):
        p = Path(name)
        if not p.is_dir():
            raise NodeError(node, "folder", folder, "folder not found" if not p.exists() else "is a file, not a folder")
        return p
    roots = input_roots()
    for root in roots:
        base = os.path.abspath(root)
        full = os.path.abspath(os.path.join(base, name))
        try:
            inside = os.path.commonpath((base, full)) == base
        except ValueError:  # Windows: another drive
            inside = False
        if not inside:
            raise NodeError(node, "folder", folder, "must stay inside the input folder (no '..' out of it); "
                                                    "give an absolute path for a folder elsewhere")
        if os.path.isdir(full):
            return Path(full)
    raise NodeError(node, "folder", folder, f"folder not found (looked in {', '.join(str(r) for r in roots)})")


def scan(root: Path, node: str) -> tuple[list[str], list[tuple[Path, int]]]:
    """(class names sorted, [(file, class index)] in class then file-name order). Hidden entries
    and files that are not images are ignored."""
    try:
        entries = sorted(e for e in os.listdir(root) if not e.startswith("."))
    except OSError as exc:
        raise NodeError(node, "folder", str(root), f"cannot be read: {exc.strerror or exc}") from None
    classes = [e for e in entries if (root / e).is_dir()]
    if not classes:
        loose = sum(e.lower().endswith(IMAGE_EXTENSIONS) for e in entries)
        hint = f" ({loose} images lie in it directly: put each class's images in a subfolder named after it)" \
            if loose else ""
        raise NodeError(node, "folder", str(root), "holds no class subfolders: a labelled image folder has one "
                                                   f"subfolder per class, e.g. 0/, 1/ ...{hint}")
    files = []
    for i, c in enumerate(classes):
        names = sorted(f for f in os.listdir(root / c)
                       if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS) and (root / c / f).is_file())
        files += [(root / c / f, i) for f in names]
    if not files:
        raise NodeError(node, "folder", str(root), f"holds no images in its {len(classes)} class subfolders "
                                                   f"(image files end with {', '.join(IMAGE_EXTENSIONS)})")
    if len(files) > MAX_IMAGES:
        raise NodeError(node, "folder", str(root), f"holds {len(files):,} images, more than {MAX_IMAGES:,}")
    return classes, files


def read_image(path: Path, channels: str, size: int, node: str) -> np.ndarray:
    """One file as float32 (H, W, C) 0..1, read as ComfyUI's LoadImage reads it."""
    from PIL import Image, ImageOps, UnidentifiedImageError
    try:
        with Image.open(path) as img:
            img = ImageOps.exif_transpose(img)
            if img.mode == "I":
                img = img.point(lambda i: i * (1 / 255))
            img = img.convert("RGB" if channels == "rgb" else "L")
            if size and img.size != (size, size):
                img = img.resize((size, size), Image.Resampling.LANCZOS)
            a = np.array(img).astype(np.float32) / 255.0
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise NodeError(node, "folder", str(path), f"cannot be read as an image: {exc}") from None
    return a[..., None] if a.ndim == 2 else a


# =================================================================================================
class AnyDeviceLoadLabeledImages(PackNode):
    DISPLAY = "Load Labeled Images (AnyDevice)"
    CATEGORY = "AnyDevice/train"
    DESCRIPTION = ("Loads a labelled image folder: one subfolder per class (its name is the class), images inside. "
                   "Classes are the subfolder names sorted (class i is the i-th name, as torchvision's "
                   "ImageFolder); images are read in name order. Outputs the images as one IMAGE batch, the class "
                   "index of each, the class names and the count. The pack ships digits/train and digits/test "
                   "(scikit-learn's 8x8 handwritten digits, 1437 + 360 images).")
    RETURN_TYPES = ("IMAGE", LABELS, "STRING", "INT")
    RETURN_NAMES = ("images", "labels", "class_names", "count")
    OUTPUT_TOOLTIPS = (
        "Every image, [B, H, W, C] float32 0..1, class by class.",
        "The class index of each image: an int64 tensor [B] (connect to a training or evaluation node).",
        "The class names, one a line, in index order (line i is class i).",
        "The number of images B.",
    )
    CHANNELS = ["rgb", "grayscale"]

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "folder": ("STRING", {
                    "default": "digits/train",
                    "tooltip": "The labelled image folder: relative to ComfyUI's input folder (the headless "
                               "runner also looks in ./, ./input and the pack's example_workflows/input), or "
                               "an absolute path. It holds one subfolder per class; files that are not images "
                               "are ignored."}),
            },
            "optional": {
                "size": ("INT", {
                    "default": 0, "min": 0, "max": 4096,
                    "tooltip": "0: images as stored (all must have the same size). N: every image resized to "
                               "N x N (Lanczos, as ComfyUI's image-set loaders stretch)."}),
                "channels": (cls.CHANNELS, {
                    "default": "rgb",
                    "tooltip": "rgb: 3 channels, as ComfyUI's IMAGE (grey images repeat their value); "
                               "grayscale: 1 channel [B, H, W, 1] (Pillow's L conversion), for a model that "
                               "takes one input channel."}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, folder="digits/train", size=0, channels="rgb"):
        """Run again when the folder's files change (names, sizes, times), not only its widgets."""
        try:
            root = resolve_folder(folder, cls.DISPLAY)
            _, files = scan(root, cls.DISPLAY)
        except NodeError as exc:
            return str(exc)
        h = [str(root), size, channels]
        for p, label in files:
            st = p.stat()
            h.append((p.name, label, st.st_size, st.st_mtime_ns))
        return hashlib.sha256(repr(h).encode()).hexdigest()

    def _run(self, folder="digits/train", size=0, channels="rgb"):
        node = self.DISPLAY
        t = Timer()
        if channels not in self.CHANNELS:
            raise NodeError(node, "channels", channels, f"must be one of {', '.join(self.CHANNELS)}")
        size = int(size)
        if size < 0:
            raise NodeError(node, "size", size, "must be 0 (as stored) or a size in pixels")
        root = resolve_folder(folder, node)
        classes, files = scan(root, node)
        images = []
        first = None
        for path, _ in files:
            a = read_image(path, channels, size, node)
            if first is None:
                first = (path, a.shape)
            elif a.shape != first[1]:
                raise NodeError(node, "folder", folder,
                                f"mixes image sizes: {path.relative_to(root)} is {a.shape[1]}x{a.shape[0]}, "
                                f"{first[0].relative_to(root)} is {first[1][1]}x{first[1][0]} (W x H); set "
                                "'size' to resize them all")
            images.append(a)
        batch = torch.from_numpy(np.stack(images))
        labels = torch.tensor([label for _, label in files], dtype=torch.int64)
        counts = np.bincount(labels.numpy(), minlength=len(classes))
        empty = [c for c, n in zip(classes, counts) if n == 0]
        if empty:
            log.warning("%s: class folders without images (their indices are kept): %s", node, ", ".join(empty))
        text = f"{len(files)} images, {len(classes)} classes, {batch.shape[2]}x{batch.shape[1]}x{batch.shape[3]}"
        ui = _host_badge(t.ms(), shape=list(batch.shape))
        ui["text"] = [text + ": " + ", ".join(f"{c}: {n}" for c, n in zip(classes, counts))]
        return {"ui": ui, "result": (batch, labels, "\n".join(classes), len(files))}


DATASET_NODES = [AnyDeviceLoadLabeledImages]
