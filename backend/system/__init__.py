"""What every part of the backend stands on: errors, settings (config.py), the backends' table
(specs.py) and the registry, the self-check, free memory (memstat.py), threads, cancel and progress,
transfer counts, JSON stores in the cache folder (store.py), and the "did this tensor change" key
(versions.py)."""
