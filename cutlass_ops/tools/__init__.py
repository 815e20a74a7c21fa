"""The tools around the library, apart from it: benchmarks (``bench`` for the conv and
FusedResNet inference, ``train_bench``, ``cvt_bench``, ``cvt_ops_bench``, ``mlp_bench``,
``giou_bench``, ``b2b_bench``, ``se_excite_bench``) on the shared timing helpers (``timing``) and
the systems table (``systems``), the profiler sweeps that write ``profiles/`` (``profiler``,
``profiler_backward``), the side-by-side training check (``train_check``) and what each
command line subcommand does (``cli``).  Run them as ``python -m cutlass_ops <command>``
(``--help`` lists them); the library (ops, modules) does not import this package."""
