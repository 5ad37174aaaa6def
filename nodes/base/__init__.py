"""What every node shares: the node base class and its errors (common), the value plumbing between
ComfyUI types and device tensors (values, resident), the input folders (inputs) and ComfyUI's memory
hooks (memory_hooks)."""
