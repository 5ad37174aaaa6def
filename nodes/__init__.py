"""ComfyUI nodes: thin adapters over ``backend/`` (filled in by the nodes work)."""
NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
