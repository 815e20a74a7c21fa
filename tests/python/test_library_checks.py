"""The checks cutlass_ops makes before and after loading its op library: the torch it was built
against, and whether each GPU can run the build's archs (errors that name what they found)."""
import pytest

from cutlass_ops._library import build_info, torch_mismatch, unsupported_gpu


def test_torch_minor_version_must_match():
    assert torch_mismatch("2.11.0+cu130", "2.11.0+cu130") is None
    assert torch_mismatch("2.11.0+cu130", "2.11.1") is None            # same minor: same C++ ABI
    assert torch_mismatch("", "2.14.1") is None                         # no record: nothing to check
    why = torch_mismatch("2.11.0+cu130", "2.14.1+cu130")
    assert "built against torch 2.11.0+cu130" in why and "torch 2.14.1+cu130" in why and "2.14" in why


@pytest.mark.parametrize("capability, archs, runs", [
    ((9, 0), "80;86;90", True), ((8, 6), "80;86;90", True), ((8, 9), "80;86;90", True),  # sm89: sm86 SASS
    ((10, 0), "80;86;90", True),   # newer than every arch: the PTX of sm_90
    ((12, 0), "80", True),
    ((7, 5), "80;86;90", False), ((7, 0), "80;90", False), ((8, 0), "86;90", False),
    ((7, 0), "70;80", True), ((8, 0), "", True),
])
def test_gpu_arch_coverage(capability, archs, runs):
    why = unsupported_gpu("Some GPU", capability, archs)
    assert (why is None) == runs
    if why:
        assert "Some GPU" in why and f"{capability[0]}.{capability[1]}" in why
        assert all(f"sm_{a}" in why for a in archs.split(";"))


def test_build_info_names_archs_and_torch():
    info = build_info()
    assert {"archs", "torch", "cuda", "kernels"} <= set(info)


def test_cuda_runtime_major_must_match_torch():
    from cutlass_ops._library import cuda_mismatch
    assert cuda_mismatch("13.0.88", "13.0") is None
    assert cuda_mismatch("13.0.88", "13.2") is None                      # one major: one libcudart
    assert cuda_mismatch("", None) is None and cuda_mismatch("", "12.8") is None   # a CPU-only build
    why = cuda_mismatch("13.0.88", "12.8")
    assert "CUDA 13.0.88" in why and "CUDA 12.8" in why and "CUDA 12" in why
    why = cuda_mismatch("13.0.88", None)
    assert "CPU-only" in why and "CUDA 13.0.88" in why


def test_driver_older_than_the_toolkit():
    from cutlass_ops._library import old_driver
    assert old_driver("13.0.88", 13000) is None and old_driver("13.0.88", 13020) is None
    assert old_driver("12.8.61", 13000) is None                          # a newer driver runs older runtimes
    assert old_driver("13.0.88", None) is None and old_driver("", 12080) is None
    why = old_driver("13.0.88", 12080)
    assert "CUDA 13.0.88" in why and "supports CUDA 12.8" in why and "driver" in why
