"""Regenerates the training workflows (learn_filter, learn_color_grade, denoise, classify_digits):
UI format, API twins and thumbnails, with example_workflows/build.py's graph writer.

    python3 example_workflows/build_training.py            # from the repository root

Each trains on this machine's automatic backend when its thumbnail is made (a few seconds each).
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


if str(HERE) not in sys.path:  # loaded by path (the tests): build.py beside this file
    sys.path.insert(0, str(HERE))
import build as B  # noqa: E402  (the graph writer, one module shared with the other generators)

# the ComfyUI core nodes these workflows use: (widget names, defaults, outputs, socket inputs)
B.CORE.setdefault("ImageBlur", (["blur_radius", "sigma"], [1, 1.0], [("IMAGE", "IMAGE")], [("image", "IMAGE")]))
B.CORE.setdefault("ImageCrop", (["width", "height", "x", "y"], [512, 512, 0, 0], [("IMAGE", "IMAGE")],
                                [("image", "IMAGE")]))

RELU = dict(activation="relu")
#: the saved view: seven columns of nodes fit a 1600x1000 window at this zoom
DS = {"scale": 0.6, "offset": [110, 140]}


def graphs() -> list:
    G = B.Graph
    out = []

    g = G("learn_filter", "Learn a filter: a single 5x5 conv (reflect padding, as ImageBlur pads) is trained to turn "
                          "noisy crops of the photo into ImageBlur's output of them (noise excites every frequency, "
                          "so the kernel is pinned down exactly), then applied through Conv2D (its weights from Layer Weights) to a crop it never saw "
                          "and scored by PSNR against ImageBlur. The learned kernel shows on the Conv2D node.")
    img = g.add("LoadImage", image="photo.png", col=0)
    crop = g.add("ImageCrop", title="training crop", image=img[0], width=128, height=128, x=0, y=0, col=0, row=1)
    held = g.add("ImageCrop", title="held-out crop", image=img[0], width=128, height=128, x=128, y=128, col=0, row=2)
    pat = g.add("AnyDeviceImagePatches", image=crop[0], patch_size=32, count=8, noise_std=0.3, clamp=False,
                patch_seed=1, col=1)
    tgt = g.add("ImageBlur", title="target: ImageBlur", image=pat[1], blur_radius=2, sigma=1.0, col=1, row=1)
    ni = g.add("AnyDeviceNetworkInput", shape="3, 32, 32", col=1, row=2)
    conv = g.add("AnyDeviceConvLayer", title="one 5x5 conv", network=ni[0], out_channels=3, kernel_size=5,
                 padding="same", padding_mode="reflect", col=2)
    tr = g.add("AnyDeviceTrainNetwork", network=conv[0], inputs=pat[1], targets=tgt[0], loss="mse", optimizer="adam",
               learning_rate=0.01, steps=300, batch_size=8, train_seed=0, col=3)
    lw = g.add("AnyDeviceLayerWeights", network=tr[0], col=2, row=1)
    app = g.add("AnyDeviceConv2D", title="learned filter", input=held[0], kernel_source="weights", weights=lw[0],
                channel_mode="grouped", out_channels=3, groups=1, padding="same", padding_mode="reflect", col=4)
    true = g.add("ImageBlur", title="true ImageBlur", image=held[0], blur_radius=2, sigma=1.0, col=4, row=1)
    g.add("AnyDeviceLoss", title="PSNR learned vs true", prediction=app[0], target=true[0], loss="psnr", col=5)
    g.add("SaveImage", images=app[0], filename_prefix="anydevice_learned_filter", col=6)
    out.append(g)

    g = G("learn_color_grade", "Learn a colour grade: a per-pixel linear map 3->3 with bias (a 1x1 conv) trained "
                               "from one before/after pair, then applied through Linear (its weights from Layer Weights) to a crop it never saw; "
                               "PSNR against the true grade.")
    img = g.add("LoadImage", image="photo.png", col=0)
    crop = g.add("ImageCrop", title="before", image=img[0], width=128, height=128, x=0, y=0, col=0, row=1)
    held = g.add("ImageCrop", title="held-out crop", image=img[0], width=128, height=128, x=128, y=128, col=0, row=2)
    grade = dict(source="text", matrix="0.9 0.15 0.05\n0.05 0.85 0.1\n0.0 0.1 0.75", bias="0.06 0.03 0.08")
    after = g.add("AnyDeviceLinear", title="after: the grade to learn", input=crop[0], col=1, **grade)
    ni = g.add("AnyDeviceNetworkInput", shape="3, 128, 128", col=1, row=1)
    lin = g.add("AnyDeviceConvLayer", title="per-pixel linear 3->3 + bias", network=ni[0], out_channels=3,
                kernel_size=1, padding="same", col=2)
    tr = g.add("AnyDeviceTrainNetwork", network=lin[0], inputs=crop[0], targets=after[0], loss="mse",
               optimizer="sgd", learning_rate=0.5, momentum=0.9, steps=300, batch_size=1, train_seed=0, col=3)
    lw = g.add("AnyDeviceLayerWeights", network=tr[0], shape="matrix", col=2, row=1)
    app = g.add("AnyDeviceLinear", title="learned grade", input=held[0], source="weights", weights=lw[0], col=4)
    true = g.add("AnyDeviceLinear", title="true grade", input=held[0], col=4, row=1, **grade)
    g.add("AnyDeviceLoss", title="PSNR learned vs true", prediction=app[0], target=true[0], loss="psnr", col=5)
    g.add("SaveImage", images=app[0], filename_prefix="anydevice_learned_grade", col=6)
    out.append(g)

    g = G("denoise", "Denoise: a small residual CNN (y = x + body(x)) trained on 256 noisy 32x32 patches of the top "
                     "of the photo, applied to a noisy crop of the bottom it never saw; PSNR before and after.")
    img = g.add("LoadImage", image="photo.png", col=0)
    top = g.add("ImageCrop", title="training region", image=img[0], width=256, height=160, x=0, y=0, col=0, row=1)
    held = g.add("ImageCrop", title="held-out crop", image=img[0], width=96, height=96, x=80, y=160, col=0, row=2)
    pat = g.add("AnyDeviceImagePatches", title="noisy patches", image=top[0], patch_size=32, count=256, noise_std=0.1,
                clamp=True, patch_seed=0, col=1)
    test = g.add("AnyDeviceImagePatches", title="noisy held-out crop", image=held[0], patch_size=96, count=1,
                 noise_std=0.1, clamp=True, patch_seed=7, col=1, row=1)
    c1 = g.add("AnyDeviceConvLayer", title="body conv 3->16", out_channels=16, kernel_size=3, padding="same",
               padding_mode="reflect", col=2)
    a1 = g.add("AnyDeviceActivationLayer", network=c1[0], col=2, row=1, **RELU)
    c2 = g.add("AnyDeviceConvLayer", title="body conv 16->16", network=a1[0], out_channels=16, kernel_size=3,
               padding="same", padding_mode="reflect", col=3)
    a2 = g.add("AnyDeviceActivationLayer", network=c2[0], col=3, row=1, **RELU)
    c3 = g.add("AnyDeviceConvLayer", title="body conv 16->3", network=a2[0], out_channels=3, kernel_size=3,
               padding="same", padding_mode="reflect", col=3, row=2)
    ni = g.add("AnyDeviceNetworkInput", shape="3, 32, 32", col=1, row=2)
    res = g.add("AnyDeviceResidual", network=ni[0], body=c3[0], col=2, row=2)
    tr = g.add("AnyDeviceTrainNetwork", network=res[0], inputs=pat[1], targets=pat[0], loss="mse", optimizer="adam",
               learning_rate=0.003, steps=300, batch_size=16, train_seed=0, col=4)
    app = g.add("AnyDeviceApplyNetwork", title="denoised", network=tr[0], input=test[1], col=5)
    g.add("AnyDeviceLoss", title="PSNR noisy", prediction=test[1], target=test[0], loss="psnr", col=5, row=1)
    g.add("AnyDeviceLoss", title="PSNR denoised", prediction=app[0], target=test[0], loss="psnr", col=5, row=2)
    g.add("SaveImage", images=test[1], filename_prefix="anydevice_noisy", col=6, row=1)
    g.add("SaveImage", images=app[0], filename_prefix="anydevice_denoised", col=6)
    out.append(g)

    g = G("classify_digits", "Classify digits: a small CNN trained on digits/train (1437 8x8 images in one folder per "
                             "class, from scikit-learn's digits) and scored on the held-out digits/test (360).")
    tr_set = g.add("AnyDeviceLoadLabeledImages", title="digits/train", folder="digits/train", channels="grayscale",
                   col=0)
    te_set = g.add("AnyDeviceLoadLabeledImages", title="digits/test", folder="digits/test", channels="grayscale",
                   col=0, row=1)
    ni = g.add("AnyDeviceNetworkInput", example=tr_set[0], col=1)
    c1 = g.add("AnyDeviceConvLayer", title="conv 1->16", network=ni[0], out_channels=16, kernel_size=3,
               padding="same", col=1, row=1)
    a1 = g.add("AnyDeviceActivationLayer", network=c1[0], col=1, row=2, **RELU)
    p1 = g.add("AnyDevicePoolLayer", title="max pool 2", network=a1[0], kind="max", kernel_size=2, col=2)
    c2 = g.add("AnyDeviceConvLayer", title="conv 16->32", network=p1[0], out_channels=32, kernel_size=3,
               padding="same", col=2, row=1)
    a2 = g.add("AnyDeviceActivationLayer", network=c2[0], col=2, row=2, **RELU)
    fl = g.add("AnyDeviceFlattenLayer", network=a2[0], col=3)
    li = g.add("AnyDeviceLinearLayer", title="linear -> 10 classes", network=fl[0], out_features=10, col=3, row=1)
    tr = g.add("AnyDeviceTrainNetwork", network=li[0], inputs=tr_set[0], targets=tr_set[1], loss="cross_entropy",
               optimizer="adamw", learning_rate=0.01, weight_decay=0.05, steps=300, batch_size=64, train_seed=0,
               col=4)
    g.add("AnyDeviceApplyNetwork", title="accuracy on digits/test", network=tr[0], input=te_set[0],
          labels=te_set[1], col=5)
    out.append(g)
    return out


def main() -> int:
    for g in graphs():
        B.write_graph(g, {"nodes": [], "extra": {"ds": DS}}, show_text=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
