"""The checks cutlass_ops makes before and after loading its op library: the torch versions its
stable-ABI library loads into, the CUDA runtime and driver, and whether each GPU can run the
build's archs (errors that name what they found)."""
import pytest

from cutlass_ops._library import build_info, torch_mismatch, unsupported_gpu


def test_stable_abi_library_loads_into_later_torch_only():
    info = {"torch": "2.14.1+cu130", "torch_min": "2.11", "torch_abi": "stable"}
    assert torch_mismatch(info, "2.11.0+cu130") is None                # built against 2.14, runs on 2.11
    assert torch_mismatch(info, "2.14.1") is None and torch_mismatch(info, "2.20.0") is None
    why = torch_mismatch(info, "2.10.1+cu128")
    assert why.startswith("cutlass_ops needs torch >= 2.11 but this is torch 2.10.1+cu128"), why
    assert "stable ABI" in why and "2.14.1+cu130" in why


def test_older_cxx_abi_library_needs_its_torch_minor_version():
    # a library recorded without torch_abi (built before the stable-ABI port): one minor version
    assert torch_mismatch({"torch": "2.11.0+cu130"}, "2.11.1") is None
    assert torch_mismatch({}, "2.14.1") is None                          # no record: nothing to check
    why = torch_mismatch({"torch": "2.11.0+cu130"}, "2.14.1+cu130")
    assert "built against torch 2.11.0+cu130" in why and "torch 2.14.1+cu130" in why and "2.14" in why


def test_this_build_uses_the_stable_abi_only():
    """The installed op library records the stable ABI and imports no C++ symbol of torch
    (at::, c10::, torch:: other than the header-only torch::stable, whose functions are inline):
    only the C functions of the stable ABI (aoti_torch_*, torch_*), so it loads into any later torch."""
    import shutil
    import subprocess
    from cutlass_ops._library import _find_library
    info = build_info()
    assert info.get("torch_abi") == "stable" and info.get("torch_min") == "2.11", info
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs binutils' nm")
    undefined = subprocess.run([nm, "-D", "-C", "--undefined-only", str(_find_library())],
                               capture_output=True, text=True, check=True).stdout.splitlines()
    cxx_torch = [line for line in undefined if any(ns in line for ns in ("at::", "c10::", "torch::", "caffe2::"))]
    assert not cxx_torch, cxx_torch[:20]
    c_torch = [line.split()[-1] for line in undefined if "aoti_torch_" in line or " torch_" in line]
    assert c_torch, "expected the stable ABI's C functions among the library's imports"


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
