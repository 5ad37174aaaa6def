"""Where things are, for every test wherever it sits in tests/: ``ROOT`` the repository (the pack),
``TESTS`` the tests folder, ``SUPPORT`` this folder (the shared helpers; conftest.py puts it on
sys.path, and a script run under another python puts it there itself).
"""
from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
