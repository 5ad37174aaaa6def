"""Data set nodes: a labelled image folder (one subfolder per class) as an IMAGE batch and labels.

    digits/train/0/0000.png, digits/train/0/0010.png, ..., digits/train/9/1796.png

Classes are the subfolder names, sorted (as torchvision's ImageFolder: class i is the i-th name);
each class's files are read in sorted name order. A class folder with no image keeps its index (so
a train and a test folder with the same classes give the same labels). Files are read as
ComfyUI's image loaders read them (Pillow, EXIF orientation applied, 16-bit "I" images scaled,
converted to RGB, /255).

As ComfyUI's own loaders, the node reads only inside the input folders (ComfyUI's input directory
and the pack's bundled inputs; the headless runner's input folders): a folder is named relative to
them, never with '..', and an absolute path or a symlink must resolve inside one. A folder
elsewhere is refused without a word about it (no count, no name). The widget lists the folders
there that look like labelled image folders.
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter, deque
from pathlib import Path

import numpy as np
import torch

from ..base.common import NodeError, PackNode, Timer
from ..base.widgets import Choice, Int, outputs
from ..base.inputs import input_roots, using_input_folders  # noqa: F401 (using_input_folders: the runner's)
from ..tensors.nodes import _host_badge

log = logging.getLogger("anydevice")

#: the socket type of a labels value: a CPU torch int64 tensor [B] of class indices
LABELS = "ANYDEVICE_LABELS"
#: what counts as an image file (ComfyUI's image-set loaders' extensions)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".jpe", ".tif", ".tiff")
MAX_IMAGES = 1_000_000
DEFAULT_FOLDER = "digits/train"
#: how deep under an input folder the widget's list looks for labelled folders ("digits/train": 2)
LIST_DEPTH = 3
#: at most this many folders are opened to make the list (a huge input folder stays quick to list)
LIST_VISITS = 2000

#: the input folders the headless runner validates and runs a workflow with (None: ComfyUI's, or
#: the runner's defaults)
def _inside(base: str, path: str) -> bool:
    try:
        return os.path.commonpath((base, path)) == base
    except ValueError:  # Windows: another drive
        return False


def resolve_folder(folder, node: str) -> tuple[Path, Path]:
    """(the folder ``folder`` names, the input folder it lies in), both with symlinks resolved.

    A name relative to an input folder (never with '..'), or an absolute path that resolves inside
    one. Anything else is refused with one message that says nothing about the folder named."""
    roots = input_roots()
    where = "the input folder" if len(roots) == 1 else "the input folders"
    if not isinstance(folder, str) or not folder.strip():
        raise NodeError(node, "folder", folder, f"must name a folder inside {where} (pick one from the list)")
    name = folder.strip()
    refused = NodeError(node, "folder", folder, f"must name a folder inside {where}: a name relative to it, "
                                                "without '..' (as ComfyUI's image loaders take names)")
    if ".." in name.replace("\\", "/").split("/"):
        raise refused
    bases = [os.path.realpath(r) for r in roots]
    if os.path.isabs(name):
        full = os.path.realpath(name)  # symlinks resolved before the check
        base = next((b for b in bases if _inside(b, full)), None)
        if base is None:
            raise refused
        found = [(full, base)]
    else:
        found = []
        for base in bases:
            full = os.path.realpath(os.path.join(base, name))
            if not _inside(base, full):  # a symlink inside an input folder that leads out of it
                raise refused
            found.append((full, base))
    for full, base in found:
        if os.path.isdir(full):
            return Path(full), Path(base)
    if any(os.path.exists(full) for full, _ in found):
        raise NodeError(node, "folder", folder, "is a file, not a folder")
    raise NodeError(node, "folder", folder, f"folder not found (looked in {', '.join(str(r) for r in roots)})")


def labeled_folders(roots=None) -> list[str]:
    """The folders under the input folders (``roots``, default ``input_roots()``) that look like
    labelled image folders: two or more of their subfolders hold an image file. Names relative to their
    input folder with '/', each once, sorted; at most LIST_DEPTH deep and LIST_VISITS folders opened
    (hidden entries and symlinks that lead out of the input folder are skipped)."""
    found = set()
    visits = 0
    for root in input_roots() if roots is None else roots:
        base = os.path.realpath(root)
        if not os.path.isdir(base):
            continue
        holds_images: dict[str, bool] = {}  # relative folder -> an image file lies in it
        queue, seen = deque([("", base, 0)]), {base}
        while queue and visits < LIST_VISITS:
            rel, path, depth = queue.popleft()
            visits += 1
            images = False
            try:
                with os.scandir(path) as it:
                    for e in it:
                        if e.name.startswith("."):
                            continue
                        if depth < LIST_DEPTH + 1 and e.is_dir():
                            real = os.path.realpath(e.path)
                            if real not in seen and _inside(base, real):
                                seen.add(real)
                                queue.append((f"{rel}/{e.name}" if rel else e.name, real, depth + 1))
                        elif not images and e.name.lower().endswith(IMAGE_EXTENSIONS) and e.is_file():
                            images = True
                            if depth == LIST_DEPTH + 1:  # a class folder at the bottom: one image is enough
                                break
            except OSError:
                continue
            holds_images[rel] = images
        # a folder with two or more subfolders (classes) that hold images; the input folder itself is no choice
        classes = Counter(rel.rpartition("/")[0] for rel, images in holds_images.items() if images and "/" in rel)
        found.update(rel for rel, n in classes.items() if n >= 2)
    return sorted(found)


def _linked_out(path: Path, base: Path) -> bool:
    """Whether ``path`` is a symlink that leads out of the input folder ``base``."""
    return path.is_symlink() and not _inside(str(base), os.path.realpath(path))


def scan(root: Path, node: str, folder=None, base: Path | None = None) -> tuple[list[str], list[tuple[Path, int]]]:
    """(class names sorted, [(file, class index)] in class then file-name order). Hidden entries
    and files that are not images are ignored; a class folder or file that is a symlink out of the
    input folder ``base`` is refused. Errors show ``folder`` (the name given) as the value."""
    shown = str(root) if folder is None else folder
    try:
        entries = sorted(e for e in os.listdir(root) if not e.startswith("."))
    except OSError as exc:
        raise NodeError(node, "folder", shown, f"cannot be read: {exc.strerror or exc}") from None
    classes = [e for e in entries if (root / e).is_dir()]
    if not classes:
        loose = sum(e.lower().endswith(IMAGE_EXTENSIONS) for e in entries)
        hint = f" ({loose} images lie in it directly: put each class's images in a subfolder named after it)" \
            if loose else ""
        raise NodeError(node, "folder", shown, "holds no class subfolders: a labelled image folder has one "
                                               f"subfolder per class, e.g. 0/, 1/ ...{hint}")
    files = []
    for i, c in enumerate(classes):
        if base is not None and _linked_out(root / c, base):
            raise NodeError(node, "folder", shown, f"class folder {c!r} is a link out of the input folder")
        names = sorted(f for f in os.listdir(root / c)
                       if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS) and (root / c / f).is_file())
        for f in names:
            if base is not None and _linked_out(root / c / f, base):
                raise NodeError(node, "folder", shown, f"file {c}/{f} is a link out of the input folder")
        files += [(root / c / f, i) for f in names]
    if not files:
        raise NodeError(node, "folder", shown, f"holds no images in its {len(classes)} class subfolders "
                                               f"(image files end with {', '.join(IMAGE_EXTENSIONS)})")
    if len(files) > MAX_IMAGES:
        raise NodeError(node, "folder", shown, f"holds {len(files):,} images, more than {MAX_IMAGES:,}")
    return classes, files


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MB"


def _over_limit(nbytes: int) -> str | None:
    """None, or the limit ``nbytes`` of float32 is over (ANYDEVICE_MAX_TENSOR_MB or a share of the
    host's free memory), said as the runner's EmptyImage size check says it."""
    from ...backend.system import config  # noqa: PLC0415
    limit, free, where = config.tensor_limit(None, nbytes)
    if nbytes <= limit:
        return None
    why = "" if free is None else f": half of the {_mb(free)} free in {where}"
    return f"over the limit of {_mb(limit)}{why} (ANYDEVICE_MAX_TENSOR_MB)"


def read_image(path: Path, channels: str, size: int, node: str, folder=None, name=None) -> np.ndarray:
    """One file as float32 (H, W, C) 0..1, read as ComfyUI's LoadImage reads it. The size its
    header gives is checked against the memory limit before anything is decoded; errors show
    ``folder`` as the value and name the file as ``name`` (its path inside the folder)."""
    from PIL import Image, ImageOps, UnidentifiedImageError
    shown = str(path) if folder is None else folder
    name = path.name if name is None else name
    try:
        with Image.open(path) as img:  # the header only: nothing is decoded yet
            w, h = img.size
            nbytes = w * h * (3 if channels == "rgb" else 1) * 4  # float32 as stored, before any resize
            why = _over_limit(nbytes)
            if why:
                raise NodeError(node, "folder", shown, f"file {name} is {w}x{h} pixels: {_mb(nbytes)} as "
                                                       f"float32, {why}")
            img = ImageOps.exif_transpose(img)
            if img.mode == "I":
                img = img.point(lambda i: i * (1 / 255))
            img = img.convert("RGB" if channels == "rgb" else "L")
            if size and img.size != (size, size):
                img = img.resize((size, size), Image.Resampling.LANCZOS)
            a = np.array(img).astype(np.float32) / 255.0
    except NodeError:
        raise
    except Image.DecompressionBombError as exc:  # not an OSError: Pillow's refusal of a huge header
        raise NodeError(node, "folder", shown, f"file {name} is too large to decode: {exc}") from None
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, EOFError) as exc:
        raise NodeError(node, "folder", shown, f"file {name} cannot be read as an image: {exc}") from None
    return a[..., None] if a.ndim == 2 else a


# =================================================================================================
class AnyDeviceLoadLabeledImages(PackNode):
    DISPLAY = "Load Labeled Images (AnyDevice)"
    CATEGORY = "AnyDevice/train"
    DESCRIPTION = ("Loads a labelled image folder from the input folder: one subfolder per class (its name is the "
                   "class), images inside. Classes are the subfolder names sorted (class i is the i-th name, as "
                   "torchvision's ImageFolder); images are read in name order. Outputs the images as one IMAGE "
                   "batch, the class index of each, the class names and the count. The pack ships digits/train "
                   "and digits/test (scikit-learn's 8x8 handwritten digits, 1437 + 360 images).")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        ("IMAGE", "images", "Every image, [B, H, W, C] float32 0..1, class by class."),
        (LABELS, "labels", "The class index of each image: an int64 tensor [B] (connect to a training or evaluation "
                           "node)."),
        ("STRING", "class_names", "The class names, one a line, in index order (line i is class i)."),
        ("INT", "count", "The number of images B."))
    CHANNELS = ["rgb", "grayscale"]

    @classmethod
    def INPUT_TYPES(cls):
        folders = labeled_folders()
        opts = {"tooltip": "The labelled image folder, inside ComfyUI's input folder (or the pack's bundled "
                           "example_workflows/input; the headless runner's input folders): one subfolder per "
                           "class, files that are not images ignored. Listed: the folders there with two or more "
                           f"subfolders of images, up to {LIST_DEPTH} levels deep."}
        if folders:  # an empty list is still a valid combo: no default then
            opts["default"] = DEFAULT_FOLDER if DEFAULT_FOLDER in folders else folders[0]
        return {
            "required": {
                "folder": (folders, opts),
            },
            "optional": {
                "size": Int(0, 0, 4096,
                            "0: images as stored (all must have the same size). N: every image resized to N x N "
                            "(Lanczos, as ComfyUI's image-set loaders stretch)."),
                "channels": Choice(cls.CHANNELS, "rgb",
                                   "rgb: 3 channels, as ComfyUI's IMAGE (grey images repeat their value); grayscale: "
                                   "1 channel [B, H, W, 1] (Pillow's L conversion), for a model that takes one input "
                                   "channel."),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, folder=None):
        """The folder must lie inside the input folders. Taking it here, ComfyUI does not check it
        against the listed folders (as LoadImage's names): a folder made after the list was read, or
        an absolute path inside an input folder, is fine. A linked folder (None) is checked when run."""
        if folder is None:
            return True
        try:
            resolve_folder(folder, cls.DISPLAY)
        except NodeError as exc:
            return str(exc)
        return True

    @classmethod
    def IS_CHANGED(cls, folder=DEFAULT_FOLDER, size=0, channels="rgb"):
        """Run again when the folder's files change (names, sizes, times), not only its widgets."""
        try:
            root, base = resolve_folder(folder, cls.DISPLAY)
            _, files = scan(root, cls.DISPLAY, folder, base)
        except NodeError as exc:
            return str(exc)
        h = [str(root), size, channels]
        for p, label in files:
            st = p.stat()
            h.append((p.name, label, st.st_size, st.st_mtime_ns))
        return hashlib.sha256(repr(h).encode()).hexdigest()

    def _run(self, folder=DEFAULT_FOLDER, size=0, channels="rgb"):
        node = self.DISPLAY
        t = Timer()
        if channels not in self.CHANNELS:
            raise NodeError(node, "channels", channels, f"must be one of {', '.join(self.CHANNELS)}")
        size = int(size)
        if size < 0:
            raise NodeError(node, "size", size, "must be 0 (as stored) or a size in pixels")
        root, base = resolve_folder(folder, node)
        classes, files = scan(root, node, folder, base)
        images = []
        first = None
        for path, _ in files:
            rel = path.relative_to(root).as_posix()
            a = read_image(path, channels, size, node, folder, rel)
            if first is None:
                first = (rel, a.shape)
                total = len(files) * a.nbytes  # the batch, known from the first image: checked before the rest
                why = _over_limit(total)
                if why:
                    raise NodeError(node, "folder", folder,
                                    f"holds {len(files):,} images of {a.shape[1]}x{a.shape[0]}: {_mb(total)} as one "
                                    f"float32 batch, {why}; set 'size' to make them smaller")
            elif a.shape != first[1]:
                raise NodeError(node, "folder", folder,
                                f"mixes image sizes: {rel} is {a.shape[1]}x{a.shape[0]}, "
                                f"{first[0]} is {first[1][1]}x{first[1][0]} (W x H); set "
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
