"""``python -m anydevice`` (the package installed by pyproject.toml maps to this folder)."""
from .cli import main

raise SystemExit(main())
