"""The tools around the library, apart from it: benchmarks (``bench`` for the conv and
FusedResNet inference, ``train_bench``, ``cvt_bench``, ``mlp_bench``, ``giou_bench``), the
profiler sweep that writes ``profiles/`` (``profiler``) and the side-by-side training check
(``train_check``).  Run them as ``python -m cutlass_ops <command>`` (``--help`` lists them);
the library (ops, autograd, modules) does not import this package."""
