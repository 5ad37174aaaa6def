"""The compute nodes: Linear, Conv2D, Activation, Loss, TensorOps (ops, conv), Resize and Pool
(windows), Normalize (norm), on the shared ComputeNode base (base) and the kernel presets (presets)."""
