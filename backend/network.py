"""Public: the Network value (``from anydevice.backend.network import Network``); the code is
backend/learn/network.py."""
from .learn.network import Network

__all__ = ["Network"]
