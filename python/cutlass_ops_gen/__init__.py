"""Build-time generator for cutlass_ops.

Reads the op manifest (manifest.py) and the measured profiles (profiles/), and writes, for
every generated op family of the registry (registry.py: conv2d_fused, conv2d_backward,
conv2d_b2b, linear_silu), one CUDA source per kernel instance, the family's C++ dispatch table
and the CMake lists of both (instances.cmake).  The conv families go through the CUTLASS
Python emitter (``cutlass_library`` from the ``nvidia-cutlass`` wheel); the others through
this package's own templates.  CMake runs it at configure time (``python -m cutlass_ops_gen``);
its output lives in the build tree only.  FusedMLP's tracer and emitter (mlp_spec.py,
mlp_emit.py) live here too: the installed package uses them at run time.
"""
