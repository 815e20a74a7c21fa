"""Import this checkout's pure-Python cutlass_ops modules beside the installed package.

The tests import the installed cutlass_ops (its compiled op library is not in the source
folder).  A pure-Python module that this checkout adds or changes (``cvt``, ``fused_cvt``,
``cvt_bench``, ``__main__``) may be missing from, or older in, the installed package until
the package is reinstalled from this checkout.  ``source_module(name)`` returns the
installed ``cutlass_ops.<name>`` when its file is identical to the checkout's; otherwise it
executes the checkout's file as a submodule of the installed package (so its relative
imports, e.g. ``from .ops import conv2d_fused``, reach the installed compiled ops), under
the real name ``cutlass_ops.<name>`` when the installed package has no such module, or
``cutlass_ops._source_<name>`` when it has an older one (which then stays untouched for
the other tests).  Nothing is copied into site-packages and sys.path is not changed.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import cutlass_ops

SOURCE = Path(__file__).resolve().parents[2] / "cutlass_ops"
INSTALLED = Path(cutlass_ops.__file__).resolve().parent


def source_module(name: str):
    src = SOURCE / f"{name}.py"
    installed = INSTALLED / f"{name}.py"
    if not src.exists():
        raise FileNotFoundError(src)
    if installed.exists() and installed.read_bytes() == src.read_bytes():
        return importlib.import_module(f"cutlass_ops.{name}")
    full = f"cutlass_ops._source_{name}" if installed.exists() else f"cutlass_ops.{name}"
    if full in sys.modules:
        return sys.modules[full]
    spec = importlib.util.spec_from_file_location(full, src)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    return module
