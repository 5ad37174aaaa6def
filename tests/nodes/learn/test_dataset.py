"""The labelled image folder node (nodes/learn/dataset.py) and the shipped digits folder
(tools/make_digits.py): counts per class, label order, pixel values against scikit-learn's
load_digits where scikit-learn is installed, and every refusal naming the node, the input and the
value."""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from anydevice.nodes.learn import dataset as D
from anydevice.nodes.base.common import NodeError

from repo_paths import ROOT  # noqa: E402
DIGITS = ROOT / "example_workflows" / "input" / "digits"
#: images per digit 0..9 in the shipped split (train_test_split(random_state=0, stratify=target))
TRAIN_COUNTS = [142, 146, 142, 146, 145, 145, 145, 143, 139, 144]
TEST_COUNTS = [36, 36, 35, 37, 36, 37, 36, 36, 35, 36]


def _make_digits():
    spec = importlib.util.spec_from_file_location("make_digits", ROOT / "tools" / "make_digits.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(**kw):
    out = D.AnyDeviceLoadLabeledImages().run(**kw)
    assert set(out) == {"ui", "result"}
    return out


@pytest.fixture
def inputs(tmp_path):
    """tmp_path/input as the one input folder (as the runner sets its folders for a workflow)."""
    d = tmp_path / "input"
    d.mkdir()
    with D.using_input_folders([d]):
        yield d


def _sklearn_or_skip():
    try:
        import sklearn  # noqa: F401
    except ImportError:
        pytest.skip("scikit-learn is not installed (a development dependency: pip install scikit-learn)")


@pytest.mark.parametrize("part,counts", [("train", TRAIN_COUNTS), ("test", TEST_COUNTS)])
def test_digits_folder(part, counts):
    out = run(folder=f"digits/{part}")  # relative: found through the runner's input folders
    images, labels, names, count = out["result"]
    assert names.split("\n") == [str(d) for d in range(10)]
    assert count == sum(counts) == images.shape[0] == labels.shape[0]
    assert images.dtype == torch.float32 and tuple(images.shape[1:]) == (8, 8, 3)
    assert labels.dtype == torch.int64
    assert np.bincount(labels.numpy(), minlength=10).tolist() == counts
    assert (np.diff(labels.numpy()) >= 0).all()  # class by class, in index order
    # the three channels repeat the grey value; every value is a multiple of 1/255
    assert torch.equal(images[..., 0], images[..., 1]) and torch.equal(images[..., 0], images[..., 2])
    k = images.numpy() * 255.0
    np.testing.assert_allclose(k, np.rint(k), atol=1e-4)
    assert "anydevice" in out["ui"] and out["ui"]["text"][0].startswith(f"{count} images, 10 classes, 8x8x3")


def test_digits_match_sklearn():
    _sklearn_or_skip()
    from sklearn.datasets import load_digits
    d = load_digits()
    md = _make_digits()
    seen = []
    for part in ("train", "test"):
        images, labels, _, _ = run(folder=str(DIGITS / part), channels="grayscale")["result"]
        files = sorted((DIGITS / part).glob("*/*.png"), key=lambda p: (p.parent.name, p.name))
        idx = np.array([int(p.stem) for p in files])
        seen.append(idx)
        np.testing.assert_array_equal(labels.numpy(), d.target[idx])
        expect = np.floor(d.images[idx] * 255.0 / 16.0 + 0.5) / 255.0  # round(v * 255 / 16), 8 -> 128
        np.testing.assert_array_equal(md.to_uint8(d.images[idx]), np.floor(d.images[idx] * 255 / 16 + 0.5))
        np.testing.assert_allclose(images[..., 0].numpy(), expect, rtol=0, atol=1e-7)
    train, test = seen
    assert len(set(train) & set(test)) == 0 and len(train) + len(test) == 1797


def test_regenerated_folder_is_the_shipped_one(tmp_path):
    _sklearn_or_skip()
    counts = _make_digits().write(tmp_path / "digits")
    assert counts == {"train": 1437, "test": 360}
    for part in ("train", "test"):
        mine = sorted(p.relative_to(tmp_path / "digits") for p in (tmp_path / "digits" / part).rglob("*.png"))
        shipped = sorted(p.relative_to(DIGITS) for p in (DIGITS / part).rglob("*.png"))
        assert mine == shipped
        for rel in mine[::7]:
            a = np.array(Image.open(tmp_path / "digits" / rel))
            b = np.array(Image.open(DIGITS / rel))
            assert a.dtype == np.uint8 and a.shape == (8, 8)
            np.testing.assert_array_equal(a, b)


def _folder(tmp_path, spec: dict) -> Path:
    """spec: {"class/file.png": (h, w, value) or bytes}"""
    for rel, what in spec.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(what, bytes):
            p.write_bytes(what)
        else:
            h, w, v = what
            Image.fromarray(np.full((h, w, 3), v, np.uint8)).save(p)
    return tmp_path


def test_labels_sizes_and_channels(inputs):
    root = _folder(inputs / "set", {
        "cat/b.png": (4, 6, 10), "cat/a.jpg": (4, 6, 20), "cat/notes.txt": b"not an image",
        "ant/x.png": (4, 6, 30), "ant/.hidden.png": b"junk", "empty/readme.md": b"",
        "dog/y.webp": (4, 6, 40), "loose.png": (9, 9, 0)})
    images, labels, names, count = run(folder="set")["result"]
    assert names == "ant\ncat\ndog\nempty"  # sorted; the empty class keeps its index
    assert labels.tolist() == [0, 1, 1, 2] and count == 4
    assert images.shape == (4, 4, 6, 3)
    # cat's files in name order: a.jpg (20, lossy) then b.png (10)
    assert abs(images[1].mean().item() * 255 - 20) < 3 and images[2].mean().item() == pytest.approx(10 / 255)
    assert images[0, 0, 0, 0].item() == np.float32(30) / np.float32(255)  # ComfyUI's /255
    g = run(folder=str(root), channels="grayscale")["result"][0]
    assert g.shape == (4, 4, 6, 1)
    r = run(folder=str(root), size=5)["result"][0]
    assert r.shape == (4, 5, 5, 3) and r[0].mean().item() == pytest.approx(30 / 255, abs=1e-6)


def test_mixed_sizes_refused_unless_resized(inputs):
    root = _folder(inputs / "mixed", {"a/1.png": (4, 6, 10), "b/2.png": (5, 6, 10)})
    with pytest.raises(NodeError, match=r"Load Labeled Images \(AnyDevice\): input 'folder' = .*mixes image sizes: "
                                        r"b/2.png is 6x5, a/1.png is 6x4 .*set 'size'"):
        run(folder=str(root))
    assert run(folder=str(root), size=3)["result"][0].shape == (2, 3, 3, 3)


def test_refusals(inputs):
    tmp_path = inputs
    with pytest.raises(NodeError, match=r"input 'folder' = 'no/such/set': folder not found \(looked in"):
        run(folder="no/such/set")
    with pytest.raises(NodeError, match="folder not found"):
        run(folder=str(tmp_path / "absent"))
    (tmp_path / "file.png").write_bytes(b"x")
    with pytest.raises(NodeError, match="is a file, not a folder"):
        run(folder=str(tmp_path / "file.png"))
    with pytest.raises(NodeError, match="must name a folder inside the input folder: a name relative to it"):
        run(folder="../../etc")
    with pytest.raises(NodeError, match="input 'folder' = '  ': must name a folder"):
        run(folder="  ")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(NodeError, match="holds no class subfolders"):
        run(folder=str(tmp_path / "nothing"))
    _folder(tmp_path / "flat", {"1.png": (2, 2, 0), "2.png": (2, 2, 0)})
    with pytest.raises(NodeError, match="2 images lie in it directly"):
        run(folder=str(tmp_path / "flat"))
    _folder(tmp_path / "noimg", {"a/x.txt": b"", "b/y.csv": b""})
    with pytest.raises(NodeError, match="holds no images in its 2 class subfolders"):
        run(folder=str(tmp_path / "noimg"))
    _folder(tmp_path / "bad", {"a/x.png": b"not a png"})
    with pytest.raises(NodeError, match=r"input 'folder' = '.*bad': file a/x.png cannot be read as an image"):
        run(folder=str(tmp_path / "bad"))
    with pytest.raises(NodeError, match="input 'channels' = 'cmyk'"):
        run(folder=str(DIGITS / "test"), channels="cmyk")


def test_comfyui_input_directory(tmp_path, monkeypatch):
    """Inside ComfyUI a relative folder is looked up in folder_paths.get_input_directory(), then in
    the pack's bundled inputs (so the bundled digits template runs as installed)."""
    _folder(tmp_path / "mine", {"x/1.png": (3, 3, 7)})
    fake = types.ModuleType("folder_paths")
    fake.get_input_directory = lambda: str(tmp_path)
    monkeypatch.setitem(sys.modules, "folder_paths", fake)
    bundled = Path(D.__file__).resolve().parents[2] / "example_workflows" / "input"
    assert D.input_roots() == [tmp_path.resolve(), bundled]
    assert run(folder="mine")["result"][3] == 1
    assert run(folder="digits/train")["result"][3] == 1437  # from the bundled inputs
    with pytest.raises(NodeError, match="folder not found"):
        run(folder="no_such_folder")


def test_is_changed_follows_the_files(inputs):
    root = _folder(inputs / "s", {"a/1.png": (2, 2, 0)})
    cls = D.AnyDeviceLoadLabeledImages
    first = cls.IS_CHANGED(folder=str(root))
    assert cls.IS_CHANGED(folder=str(root)) == first
    _folder(root, {"b/2.png": (2, 2, 0)})
    assert cls.IS_CHANGED(folder=str(root)) != first


# ---- only inside the input folders (as ComfyUI's loaders), saying nothing about a folder elsewhere ----
L = D.AnyDeviceLoadLabeledImages
REFUSAL = "must name a folder inside the input folder: a name relative to it, without '..' (as ComfyUI's image " \
          "loaders take names)"


def _secret(tmp_path) -> Path:
    """A labelled folder outside every input folder: 3 classes with an image each."""
    return _folder(tmp_path / "outside" / "secret", {"alpha/1.png": (2, 2, 0), "beta/2.png": (2, 2, 9),
                                                     "gamma/3.png": (2, 2, 5)})


def test_folders_outside_the_input_folder_are_refused_saying_nothing_about_them(inputs, tmp_path):
    secret = _secret(tmp_path)
    (inputs / "link").symlink_to(secret, target_is_directory=True)  # a symlink out of the input folder
    (inputs / "up").symlink_to(tmp_path / "outside", target_is_directory=True)
    (inputs / "sub").mkdir()
    for name in ("/etc", str(secret), str(tmp_path / "outside" / "absent"), "../outside/secret",
                 "sub/../../outside/secret", "sub/../link", "link", "up/secret", str(inputs / "link"),
                 str(inputs / "up" / "secret"), "..", "/"):
        expect = str(NodeError(L.DISPLAY, "folder", name, REFUSAL))  # the same words whatever lies there
        with pytest.raises(NodeError) as e:
            run(folder=name)
        assert str(e.value) == expect
        assert L.VALIDATE_INPUTS(folder=name) == expect  # refused when the prompt is queued
        assert L.IS_CHANGED(folder=name) == expect
    assert "alpha" not in expect and "3" not in expect.split("': ")[-1]


def test_links_out_of_the_input_folder_inside_a_set_are_refused(inputs, tmp_path):
    secret = _secret(tmp_path)
    _folder(inputs / "set", {"mine/1.png": (2, 2, 0)})
    (inputs / "set" / "theirs").symlink_to(secret / "alpha", target_is_directory=True)
    with pytest.raises(NodeError, match=r"^Load Labeled Images \(AnyDevice\): input 'folder' = 'set': class folder "
                                        r"'theirs' is a link out of the input folder$"):
        run(folder="set")
    (inputs / "set" / "theirs").unlink()
    (inputs / "set" / "mine" / "2.png").symlink_to(secret / "beta" / "2.png")
    with pytest.raises(NodeError, match=r"input 'folder' = 'set': file mine/2.png is a link out of the input folder$"):
        run(folder="set")
    # links that stay inside the input folder are fine, absolute paths inside it too
    (inputs / "set" / "mine" / "2.png").unlink()
    (inputs / "alias").symlink_to(inputs / "set", target_is_directory=True)
    _folder(inputs / "set", {"other/1.png": (2, 2, 4)})
    for name in ("alias", str(inputs / "set"), "set/", "./set"):
        assert L.VALIDATE_INPUTS(folder=name) is True
        assert run(folder=name)["result"][2] == "mine\nother"


def test_widget_lists_the_labelled_folders_of_the_input_folder(inputs, tmp_path):
    _folder(inputs / "pets", {"cat/1.png": (2, 2, 0), "dog/2.png": (2, 2, 0)})
    _folder(inputs / "deep" / "a" / "b", {"x/1.png": (2, 2, 0), "y/1.jpg": (2, 2, 0)})  # 3 levels down
    _folder(inputs / "deeper" / "a" / "b" / "c", {"x/1.png": (2, 2, 0), "y/1.png": (2, 2, 0)})
    _folder(inputs / "flat", {"1.png": (2, 2, 0), "2.png": (2, 2, 0)})  # no class subfolders
    _folder(inputs / "single", {"only/1.png": (2, 2, 0)})  # one class
    _folder(inputs / "notes", {"a/x.txt": b"", "b/y.txt": b""})  # no images
    _folder(inputs / ".hidden", {"a/1.png": (2, 2, 0), "b/1.png": (2, 2, 0)})
    (inputs / "link").symlink_to(_secret(tmp_path), target_is_directory=True)  # leads out: not listed
    folders, opts = L.INPUT_TYPES()["required"]["folder"]
    assert folders == ["deep/a/b", "pets"]
    assert opts["default"] == "deep/a/b" and opts["tooltip"]  # digits/train is not in this input folder
    for name in folders:
        assert L.VALIDATE_INPUTS(folder=name) is True
    assert run(folder="pets")["result"][2] == "cat\ndog"


def test_an_empty_list_is_still_a_valid_combo(inputs):
    folders, opts = L.INPUT_TYPES()["required"]["folder"]
    assert folders == [] and "default" not in opts and opts["tooltip"]
    assert L.VALIDATE_INPUTS(folder="digits/train") == \
        f"Load Labeled Images (AnyDevice): input 'folder' = 'digits/train': folder not found (looked in {inputs})"
    assert L.VALIDATE_INPUTS(folder=None) is True  # a linked folder is checked when it runs


def test_the_bundled_sets_are_listed_and_the_example_workflows_validate(tmp_path, monkeypatch):
    import json
    wf = json.loads((ROOT / "example_workflows" / "api" / "classify_digits.json").read_text())
    values = {n["inputs"]["folder"] for n in wf.values() if n["class_type"] == L.__name__}
    assert values == {"digits/train", "digits/test"}
    folders, opts = L.INPUT_TYPES()["required"]["folder"]  # headless: ./, ./input, the bundled inputs
    assert {"digits/train", "digits/test"} <= set(folders) and opts["default"] == "digits/train"
    fake = types.ModuleType("folder_paths")  # inside ComfyUI: its input folder, then the bundled inputs
    fake.get_input_directory = lambda: str(tmp_path)
    monkeypatch.setitem(sys.modules, "folder_paths", fake)
    folders, opts = L.INPUT_TYPES()["required"]["folder"]
    assert folders == ["digits/test", "digits/train"] and opts["default"] == "digits/train"
    assert all(L.VALIDATE_INPUTS(folder=v) is True for v in values)


# ---- huge images: refused from their header, before anything is decoded ------------------------------
def _png_header(w: int, h: int) -> bytes:
    """A PNG whose header says w x h RGB (its pixel data is a few bytes: it never decodes)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def test_a_decompression_bomb_header_is_a_clear_error(inputs):
    import tracemalloc
    _folder(inputs / "bomb", {"a/ok.png": (2, 2, 0), "b/huge.png": _png_header(100000, 100000)})
    tracemalloc.start()
    try:
        with pytest.raises(NodeError) as e:
            run(folder="bomb")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value).startswith("Load Labeled Images (AnyDevice): input 'folder' = 'bomb': file b/huge.png is "
                                   "too large to decode: Image size (10000000000 pixels) exceeds limit"), str(e.value)
    assert peak < 8 * 2**20


def test_an_image_over_the_memory_limit_is_refused_from_its_header(inputs, monkeypatch):
    import tracemalloc
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "64")
    _folder(inputs / "big", {"a/ok.png": (2, 2, 0), "b/big.png": _png_header(5000, 5000)})  # no bomb to Pillow
    tracemalloc.start()
    try:
        with pytest.raises(NodeError) as e:
            run(folder="big", size=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == ("Load Labeled Images (AnyDevice): input 'folder' = 'big': file b/big.png is 5000x5000 "
                            "pixels: 286.1 MB as float32, over the limit of 64.0 MB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 8 * 2**20
    # the batch, known from the first image, before the others are read
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    _folder(inputs / "many", {f"{c}/{i}.png": (256, 256, 0) for c in "ab" for i in range(3)})
    with pytest.raises(NodeError, match=r"^Load Labeled Images \(AnyDevice\): input 'folder' = 'many': holds 6 "
                                        r"images of 256x256: 4.5 MB as one float32 batch, over the limit of 1.0 MB "
                                        r"\(ANYDEVICE_MAX_TENSOR_MB\); set 'size' to make them smaller$"):
        run(folder="many")
    assert run(folder="many", size=64)["result"][3] == 6
