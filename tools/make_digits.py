"""Write scikit-learn's digits data set as a labelled image folder (one subfolder per class).

    .venv/bin/python tools/make_digits.py [--out example_workflows/input/digits]

``sklearn.datasets.load_digits``: 1797 handwritten digits, 8x8 pixels, values 0..16. Each image is
written as an 8x8 grayscale PNG with pixel = round(value * 255 / 16) (value 8 -> 128) to
``OUT/train/<digit>/NNNN.png`` or ``OUT/test/<digit>/NNNN.png``, NNNN being the image's index in
``load_digits()`` (so a file can be traced back to its sample). The test set is a fixed, stratified
20%: ``train_test_split(indices, test_size=0.2, random_state=0, stratify=target)`` (1437 train,
360 test). ``OUT/train`` and ``OUT/test`` are replaced; nothing else in OUT is touched.

scikit-learn is a development dependency only: the repository ships the generated folder
(example_workflows/input/digits), and tests/nodes/learn/test_dataset.py regenerates it into a temporary
folder and compares when scikit-learn is installed.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "example_workflows" / "input" / "digits"
TEST_SIZE = 0.2
RANDOM_STATE = 0

README = """\
The digits data set of scikit-learn (sklearn.datasets.load_digits), written by tools/make_digits.py
as a labelled image folder: train/<digit>/NNNN.png and test/<digit>/NNNN.png, 8x8 grayscale PNGs,
pixel = round(value * 255 / 16) of the original 0..16 values, NNNN the sample's index in load_digits().
The test set is a fixed stratified 20% (train_test_split(random_state=0, stratify=target)):
1437 training and 360 test images.

Source: "Optical Recognition of Handwritten Digits", E. Alpaydin and C. Kaynak, UCI Machine
Learning Repository (https://doi.org/10.24432/C50P49), licensed under CC BY 4.0
(https://creativecommons.org/licenses/by/4.0/); scikit-learn ships its test part.
"""


def to_uint8(images: np.ndarray) -> np.ndarray:
    """0..16 values -> 0..255 pixels: round(value * 255 / 16), halves up."""
    return np.floor(np.asarray(images, np.float64) * 255.0 / 16.0 + 0.5).astype(np.uint8)


def split():
    """(images (N, 8, 8) 0..16, targets (N,), train indices, test indices), both index lists sorted."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    idx = np.arange(len(d.target))
    train, test = train_test_split(idx, test_size=TEST_SIZE, random_state=RANDOM_STATE, stratify=d.target)
    return d.images, d.target, np.sort(train), np.sort(test)


def write(out: Path) -> dict:
    """Write the folder; returns {"train": count, "test": count}."""
    from PIL import Image
    images, target, train, test = split()
    pixels = to_uint8(images)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for part, indices in (("train", train), ("test", test)):
        folder = out / part
        if folder.exists():
            shutil.rmtree(folder)
        for digit in range(10):
            (folder / str(digit)).mkdir(parents=True)
        for i in indices:
            Image.fromarray(pixels[i]).save(folder / str(int(target[i])) / f"{int(i):04d}.png",
                                                      optimize=False, compress_level=9)
        counts[part] = len(indices)
    (out / "README.txt").write_text(README)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    counts = write(args.out)
    sys.stdout.write(f"{args.out}: {counts['train']} train, {counts['test']} test images\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
