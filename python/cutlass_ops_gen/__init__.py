"""Build-time generator for cutlass_ops.

Reads the op manifest (manifest.py) and the measured profiles (profiles/), and writes one
CUDA source per CUTLASS kernel instance plus a C++ dispatch table, through the CUTLASS
Python emitter (``cutlass_library`` from the ``nvidia-cutlass`` wheel).  CMake runs it at
configure time (``python -m cutlass_ops_gen``); its output lives in the build tree only.
"""
