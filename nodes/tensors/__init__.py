"""The tensor nodes: DeviceSelect, TensorSource, TensorInfo, Weights and the IMAGE/MASK/LATENT <-> TENSOR
conversions."""
