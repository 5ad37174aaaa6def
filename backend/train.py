"""Public: training a Network (``from anydevice.backend.train import train``); the code is
backend/learn/train.py."""
from .learn.train import TrainResult, predict, train

__all__ = ["train", "predict", "TrainResult"]
