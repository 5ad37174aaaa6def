"""The devices: one package each (numpy, torch, opencl, cuda), each with ``probe(name)`` and
``create(name, index)`` for the registry (system/specs.py names them), and ``runtime/``, what the
compiled-kernel devices share (kernel sources and signatures, program binaries, the conv/GEMM plan)."""
