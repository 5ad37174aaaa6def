"""The ComfyUI core nodes the headless runner stands in for (LoadImage, SaveImage, PreviewImage,
EmptyImage, EmptyLatentImage, ImageBlur, ImageSharpen, ImageScale, ImageCrop), with ComfyUI's INPUT_TYPES, file naming and input folders."""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from .. import NODE_CLASS_MAPPINGS as PACK_NODES
from ...backend.system import config
from ...backend.system.errors import short

from ..base.inputs import EXAMPLE_INPUTS, PACK_ROOT, input_folders  # noqa: F401 (the runner and tests read them here)
from ..base.widgets import Float, Int


class WorkflowError(Exception):
    """A workflow that cannot run here: one problem a line, each naming node id, class, input and
    value. ``exit_code`` 2 for a file that is no workflow, 1 for a workflow that fails validation."""

    def __init__(self, problems, exit_code: int = 1):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))
        self.exit_code = exit_code


# ---------------------------------------------------------------------------------------------
# the core nodes the runner does itself (with Pillow), matching ComfyUI's behaviour
# ---------------------------------------------------------------------------------------------
MAX_RESOLUTION = 16384  # ComfyUI's nodes.MAX_RESOLUTION


class _Ctx:
    def __init__(self, output_dir: Path, input_image: Path | None, search: list[Path]):
        self.output_dir = output_dir
        self.input_image = input_image
        self.search = search
        self.saved: list[dict] = []


def _save_path(output_dir: Path, filename_prefix: str, width: int, height: int):
    """folder_paths.get_save_image_path: (folder, filename, counter, subfolder)."""
    filename_prefix = filename_prefix.replace("%width%", str(width)).replace("%height%", str(height))
    subfolder = os.path.dirname(os.path.normpath(filename_prefix))
    filename = os.path.basename(os.path.normpath(filename_prefix))
    full = output_dir / subfolder
    if os.path.commonpath((str(output_dir.resolve()), str(full.resolve()))) != str(output_dir.resolve()):
        raise WorkflowError(f"filename_prefix {filename_prefix!r} points outside the output folder")
    full.mkdir(parents=True, exist_ok=True)

    def map_filename(name):
        plen = len(filename)
        prefix = name[:plen + 1]
        try:
            digits = int(name[plen + 1:].split("_")[0])
        except ValueError:
            digits = 0
        return digits, prefix

    try:
        counter = max(d for d, p in map(map_filename, os.listdir(full))
                      if os.path.normcase(p[:-1]) == os.path.normcase(filename) and p[-1:] == "_") + 1
    except ValueError:
        counter = 1
    return full, filename, counter, subfolder


def _save_images(ctx: _Ctx, images, filename_prefix: str, kind: str, folder: Path):
    from PIL import Image
    if not torch.is_tensor(images) or images.ndim != 4:
        raise WorkflowError(f"images must be an IMAGE [B,H,W,C], got {type(images).__name__}")
    full, filename, counter, subfolder = _save_path(folder, filename_prefix, images.shape[2], images.shape[1])
    results = []
    for batch_number, image in enumerate(images):
        i = 255.0 * image.cpu().numpy()
        img = Image.fromarray(np.clip(i, 0, 255).astype(np.uint8))
        name = filename.replace("%batch_num%", str(batch_number))
        file = f"{name}_{counter:05}_.png"
        img.save(full / file, compress_level=4 if kind == "output" else 1)
        results.append({"filename": file, "subfolder": subfolder, "type": kind})
        ctx.saved.append({"path": str(full / file), "filename": file, "subfolder": subfolder, "type": kind})
        counter += 1
    return {"ui": {"images": results}, "result": ()}


def _image_bytes(batch_size, height, width, channels) -> str | None:
    """None, or why a float32 result of that size is refused (ANYDEVICE_MAX_TENSOR_MB)."""
    nbytes = batch_size * height * width * channels * 4
    limit, free, where = config.tensor_limit(None, nbytes)
    if nbytes <= limit:
        return None
    why = "" if free is None else f": half of the {free / 2**20:.0f} MB free in {where}"
    return (f"inputs batch_size x height x width = {batch_size} x {height} x {width}: {nbytes / 2**20:.0f} MB, "
            f"over the limit of {limit / 2**20:.0f} MB{why} (ANYDEVICE_MAX_TENSOR_MB)")


class _Core:
    """A ComfyUI core node the runner does itself: INPUT_TYPES as ComfyUI declares it, and
    ``check(ctx, **inputs)`` for what ComfyUI checks beyond types and ranges (None: fine)."""

    RETURN_TYPES: tuple = ()
    OUTPUT_NODE = False

    @classmethod
    def check(cls, ctx: _Ctx, **inputs) -> str | None:
        return None


def _size(default: int, minimum: int, step: int = 1):
    return Int(default, minimum, MAX_RESOLUTION, step=step)


BATCH = Int(1, 1, 4096)


class LoadImage(_Core):
    RETURN_TYPES = ("IMAGE", "MASK")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("STRING", {"image_upload": True})}}

    @classmethod
    def check(cls, ctx: _Ctx, image=None, **_):
        if ctx.input_image is None and image is not None:
            _find_input(image, ctx.search)  # raises WorkflowError: outside the folders, or missing
        return None

    def run(self, ctx: _Ctx, image, **_):
        from PIL import Image, ImageOps
        path = ctx.input_image or _find_input(image, ctx.search)
        img = Image.open(path)
        img = ImageOps.exif_transpose(img)
        if img.mode == "I":
            img = img.point(lambda i: i * (1 / 255))
        rgb = np.array(img.convert("RGB")).astype(np.float32) / 255.0
        out = torch.from_numpy(rgb)[None]
        if "A" in img.getbands():
            mask = 1.0 - torch.from_numpy(np.array(img.getchannel("A")).astype(np.float32) / 255.0)
        else:
            mask = torch.zeros((64, 64), dtype=torch.float32)
        return (out, mask.unsqueeze(0))


class SaveImage(_Core):
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING", {"default": "ComfyUI"})}}

    def run(self, ctx: _Ctx, images, filename_prefix="ComfyUI", **_):
        return _save_images(ctx, images, filename_prefix, "output", ctx.output_dir)


class PreviewImage(_Core):
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",)}}

    def run(self, ctx: _Ctx, images, **_):
        prefix = "ComfyUI_temp_" + "".join(random.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
        return _save_images(ctx, images, prefix, "temp", ctx.output_dir / "temp")


class EmptyImage(_Core):
    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"width": _size(512, 1), "height": _size(512, 1), "batch_size": BATCH,
                             "color": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFF, "step": 1,
                                               "display": "color"})}}

    @classmethod
    def check(cls, ctx, width=512, height=512, batch_size=1, **_):
        return _image_bytes(batch_size, height, width, 3)

    def run(self, ctx: _Ctx, width=512, height=512, batch_size=1, color=0, **_):
        r = torch.full([batch_size, height, width, 1], ((color >> 16) & 0xFF) / 0xFF)
        g = torch.full([batch_size, height, width, 1], ((color >> 8) & 0xFF) / 0xFF)
        b = torch.full([batch_size, height, width, 1], (color & 0xFF) / 0xFF)
        return (torch.cat((r, g, b), dim=-1),)


class EmptyLatentImage(_Core):
    RETURN_TYPES = ("LATENT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"width": _size(512, 16, 8), "height": _size(512, 16, 8), "batch_size": BATCH}}

    @classmethod
    def check(cls, ctx, width=512, height=512, batch_size=1, **_):
        return _image_bytes(batch_size, height // 8, width // 8, 4)

    def run(self, ctx: _Ctx, width=512, height=512, batch_size=1, **_):
        return ({"samples": torch.zeros([batch_size, 4, height // 8, width // 8])},)


# ---- image post-processing and transforms (comfy_extras/nodes_post_processing.py, nodes_images.py, nodes.py)
def _gaussian_kernel(kernel_size: int, sigma: float) -> torch.Tensor:
    """comfy_extras.nodes_post_processing.gaussian_kernel: on a [-1, 1] grid, normalised to sum 1."""
    x, y = torch.meshgrid(torch.linspace(-1, 1, kernel_size), torch.linspace(-1, 1, kernel_size), indexing="ij")
    d = torch.sqrt(x * x + y * y)
    g = torch.exp(-(d * d) / (2.0 * sigma * sigma))
    return g / g.sum()


def _image(images, arg: str = "image") -> torch.Tensor:
    if not torch.is_tensor(images) or images.ndim != 4:
        raise WorkflowError(f"{arg} must be an IMAGE [B,H,W,C], got {type(images).__name__}")
    return images


def _filter(image: torch.Tensor, kernel: torch.Tensor, radius: int) -> torch.Tensor:
    """The IMAGE convolved channel by channel with the (2*radius+1)-square kernel on a reflect-padded
    copy, cropped back to its size (as ComfyUI's ImageBlur and ImageSharpen)."""
    import torch.nn.functional as F
    channels = image.shape[-1]
    x = F.pad(image.permute(0, 3, 1, 2), (radius,) * 4, "reflect")
    y = F.conv2d(x, kernel.repeat(channels, 1, 1).unsqueeze(1), padding=kernel.shape[-1] // 2, groups=channels)
    return y[:, :, radius:-radius, radius:-radius].permute(0, 2, 3, 1)


class ImageBlur(_Core):
    """ComfyUI's ImageBlur: a gaussian of size 2*radius+1 on a reflect-padded image."""

    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",),
                             "blur_radius": Int(1, 1, 31, step=1),
                             "sigma": Float(1.0, 0.1, 10.0, 0.1)}}

    def run(self, ctx: _Ctx, image, blur_radius=1, sigma=1.0, **_):
        image = _image(image)
        if blur_radius == 0:
            return (image,)
        return (_filter(image, _gaussian_kernel(blur_radius * 2 + 1, sigma), blur_radius),)


class ImageSharpen(_Core):
    """ComfyUI's ImageSharpen: centre 1 minus alpha*10 times a gaussian's off-centre part, clamped to 0..1."""

    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",),
                             "sharpen_radius": Int(1, 1, 31, step=1),
                             "sigma": Float(1.0, 0.1, 10.0, 0.01),
                             "alpha": Float(1.0, 0.0, 5.0, 0.01)}}

    def run(self, ctx: _Ctx, image, sharpen_radius=1, sigma=1.0, alpha=1.0, **_):
        image = _image(image)
        if sharpen_radius == 0:
            return (image,)
        kernel_size = sharpen_radius * 2 + 1
        kernel = _gaussian_kernel(kernel_size, sigma) * -(alpha * 10)
        kernel = kernel.to(dtype=image.dtype)
        center = kernel_size // 2
        kernel[center, center] = kernel[center, center] - kernel.sum() + 1.0
        return (torch.clamp(_filter(image, kernel, sharpen_radius), 0, 1),)


class ImageScale(_Core):
    """ComfyUI's ImageScale (comfy.utils.common_upscale; lanczos through Pillow as ComfyUI does)."""

    RETURN_TYPES = ("IMAGE",)
    upscale_methods = ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]
    crop_methods = ["disabled", "center"]

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",), "upscale_method": (cls.upscale_methods,),
                             "width": _size(512, 0),
                             "height": _size(512, 0),
                             "crop": (cls.crop_methods,)}}

    @classmethod
    def check(cls, ctx, width=512, height=512, **_):
        return _image_bytes(1, max(1, height), max(1, width), 3)

    def run(self, ctx: _Ctx, image, upscale_method="nearest-exact", width=512, height=512, crop="disabled", **_):
        image = _image(image)
        if width == 0 and height == 0:
            return (image,)
        samples = image.movedim(-1, 1)
        if width == 0:
            width = max(1, round(samples.shape[3] * height / samples.shape[2]))
        elif height == 0:
            height = max(1, round(samples.shape[2] * width / samples.shape[3]))
        return (_common_upscale(samples, width, height, upscale_method, crop).movedim(1, -1),)


def _common_upscale(samples, width, height, upscale_method, crop):
    """comfy.utils.common_upscale for [B, C, H, W]."""
    if crop == "center":
        old_width, old_height = samples.shape[-1], samples.shape[-2]
        old_aspect, new_aspect = old_width / old_height, width / height
        x = y = 0
        if old_aspect > new_aspect:
            x = round((old_width - old_width * (new_aspect / old_aspect)) / 2)
        elif old_aspect < new_aspect:
            y = round((old_height - old_height * (old_aspect / new_aspect)) / 2)
        s = samples.narrow(-2, y, old_height - y * 2).narrow(-1, x, old_width - x * 2)
    else:
        s = samples
    if upscale_method == "lanczos":  # comfy.utils.lanczos: Pillow per image, 8-bit
        from PIL import Image
        out = []
        for img in s:
            arr = np.clip(255.0 * img.movedim(0, -1).cpu().numpy(), 0, 255).astype(np.uint8)
            pil = Image.fromarray(arr.squeeze(-1) if arr.shape[-1] == 1 else arr)
            pil = pil.resize((width, height), resample=Image.Resampling.LANCZOS)
            a = torch.from_numpy(np.array(pil).astype(np.float32) / 255.0)
            out.append(a.unsqueeze(0) if a.ndim == 2 else a.movedim(-1, 0))
        return torch.stack(out).to(s.dtype)
    return torch.nn.functional.interpolate(s, size=(height, width), mode=upscale_method)


class ImageCrop(_Core):
    """ComfyUI's ImageCrop (comfy_extras/nodes_images.py): x, y clipped to the image, then a slice."""

    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",),
                             "width": _size(512, 1),
                             "height": _size(512, 1),
                             "x": _size(0, 0),
                             "y": _size(0, 0)}}

    def run(self, ctx: _Ctx, image, width=512, height=512, x=0, y=0, **_):
        image = _image(image)
        x = min(x, image.shape[2] - 1)
        y = min(y, image.shape[1] - 1)
        return (image[:, y:height + y, x:width + x, :],)


CORE_NODES = {c.__name__: c for c in (LoadImage, SaveImage, PreviewImage, EmptyImage, EmptyLatentImage, ImageBlur,
                                      ImageSharpen, ImageScale, ImageCrop)}


def _node_class(class_type):
    return PACK_NODES.get(class_type) or CORE_NODES.get(class_type)


def _display(class_type) -> str:
    return getattr(PACK_NODES.get(class_type), "DISPLAY", class_type)


def _find_input(name, search: list[Path]) -> Path:
    """The file ``name`` names inside one of the input folders. As in ComfyUI, a name may hold
    subfolders but never leaves its folder: absolute paths, drives and '..' that climb out are
    refused (``--input PATH`` loads any file)."""
    where = f"input 'image' = {short(name)}"
    if not isinstance(name, str) or not name.strip():
        raise WorkflowError(f"{where}: must be an image file name")
    for d in search:
        base = os.path.abspath(d)
        full = os.path.abspath(os.path.join(base, name))
        try:
            inside = os.path.commonpath((base, full)) == base and full != base
        except ValueError:  # Windows: another drive
            inside = False
        if not inside:
            raise WorkflowError(f"{where}: must name a file inside the input folders (no absolute path, no "
                                "'..' out of them); pass --input PATH to load another file")
        if os.path.isfile(full):
            return Path(full)
    raise WorkflowError(f"{where}: file not found (looked in {', '.join(str(d) for d in search)}); "
                        "pass --input PATH")


