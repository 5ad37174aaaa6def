"""The learning nodes: build a network on the canvas, train it, apply it, save and load it.

A network travels between nodes as an ``ANYDEVICE_NETWORK``: a ``backend.network.Network``
(immutable, so ComfyUI's cache may hold it). Layer nodes each take an optional network and return it
with one layer appended; a **Network Input** node at the start of the chain fixes the input shape,
and from then on every layer node says its output shape on the node (and refuses a layer that does
not take its input, naming it). **Train Network** runs ``backend.train.train`` on the chosen backend
(cancel checked before every step; progress on ComfyUI's bar and the loss sent to the page as an
``anydevice.train`` event, which web/anydevice_train.js draws as a live curve, every
``cancel.REPORT_SECONDS`` of wall time and at the last step) and returns the
trained network, a ``LOSS_MAP`` for ComfyUI's own Plot Loss Graph node and the final loss.
**Apply Network** returns the type it was given (IMAGE in, IMAGE out); class scores give predicted
labels (``ANYDEVICE_LABELS``: an int64 torch tensor [B]) and, with the true labels, the accuracy.
**Save / Load Network** keep networks as safetensors files in ``models/anydevice/`` (registered with
ComfyUI's ``folder_paths``; without ComfyUI: ``./models/anydevice``).

The nodes live in learn_layers.py (Network Input, the layer nodes, Residual) and learn_train.py (Train,
Apply, Save, Load, Layer Weights, Image Patches), with what they share in learn_common.py; this module
names them and keeps ``NETWORK_NODES`` in the order the menu shows them.
"""
from __future__ import annotations

# flake8: noqa: F401
from .common import (CATEGORY, CURVE_POINTS, LABELS, LOSS_MAP, MODEL_FOLDER, NETWORK, SEED_MAX, _LearnNode,
                           _layer_text, _network, from_batch, model_dirs, network_files, network_path,
                           register_model_folder, shape_report, to_batch)
from .layers import (AnyDeviceActivationLayer, AnyDeviceConvLayer, AnyDeviceDropoutLayer, AnyDeviceFlattenLayer,
                           AnyDeviceLinearLayer, AnyDeviceNetworkInput, AnyDeviceNormLayer, AnyDevicePoolLayer,
                           AnyDeviceResidual, AnyDeviceUpsampleLayer, _LayerNode)
from .train import (LOSSES, OPTIMIZERS, AnyDeviceApplyNetwork, AnyDeviceImagePatches, AnyDeviceLayerWeights,
                          AnyDeviceLoadNetwork, AnyDeviceSaveNetwork, AnyDeviceTrainNetwork)

NETWORK_NODES = [AnyDeviceNetworkInput, AnyDeviceConvLayer, AnyDeviceLinearLayer, AnyDeviceActivationLayer,
                 AnyDeviceNormLayer, AnyDevicePoolLayer, AnyDeviceUpsampleLayer, AnyDeviceDropoutLayer,
                 AnyDeviceFlattenLayer, AnyDeviceResidual, AnyDeviceTrainNetwork, AnyDeviceApplyNetwork,
                 AnyDeviceSaveNetwork, AnyDeviceLoadNetwork, AnyDeviceLayerWeights, AnyDeviceImagePatches]
