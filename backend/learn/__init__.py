"""The learning side of the pack below the Network value: one class per layer kind and their registry
(``layers/``), and reading a network's JSON spec (``spec.py``).

``backend/network.py`` holds the Network value and the walks over its layers; it asks the registry
what each layer is. Nothing here imports network.py, and importing this package imports nothing.
"""
