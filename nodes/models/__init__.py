"""Model / VAE / Upscale Model on AnyDevice: ComfyUI's own models compiled onto the pack's kernels."""
