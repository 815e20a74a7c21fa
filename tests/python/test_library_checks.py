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
