"""The generator registry and the per-family CMake lists: every generated family goes through one
interface, and every hand-written source of kernels/ is built through its family's sources.cmake."""
import re
from pathlib import Path

import pytest

from cutlass_ops_gen.__main__ import main as generate
from cutlass_ops_gen.registry import ARCH_FAMILIES, FAMILIES, BuildOptions

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "kernels"


def _cmake_sets(path: Path) -> dict[str, list[str]]:
    sets = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"set\((\S+) ?(.*)\)", line)
        if m:
            sets[m[1]] = [Path(f.strip('"')).name for f in m[2].split()]
    return sets


def test_every_family_has_a_kernels_folder_and_sources_list():
    for family in FAMILIES:
        assert (KERNELS / family.name / "sources.cmake").is_file(), family.name


@pytest.mark.parametrize("archs, kernel_set", [((80,), "ci"), ((70, 80, 90), "ci"), ((80, 90), "all")])
def test_instances_cmake_has_each_familys_lists(archs, kernel_set, tmp_path):
    assert generate(["--archs", ",".join(map(str, archs)), "--kernels", kernel_set, "--sm90-backward",
                     "--out", str(tmp_path)]) == 0
    sets = _cmake_sets(tmp_path / "instances.cmake")
    assert sets["CUTLASS_OPS_GENERATED_FAMILIES"] == [f.name for f in FAMILIES]
    options = BuildOptions(archs, kernel_set, True)
    for family in FAMILIES:
        sel = family.select(options)
        listed = []
        for arch in ARCH_FAMILIES:
            files = sets[f"CUTLASS_OPS_GENERATED_{family.cmake_name}_SM{arch}"]
            assert all(family.arch_family(i) == arch for i in sel.instances if i.source in files)
            listed += files
        assert sorted(listed) == sorted(i.source for i in sel.instances), family.name
        assert all((tmp_path / f).is_file() for f in listed)
        assert sets[f"CUTLASS_OPS_GENERATED_{family.cmake_name}_DISPATCH"] == [family.dispatch_table]
        assert (tmp_path / family.dispatch_table).is_file()


def test_every_hand_written_source_is_in_one_family_list():
    named = []
    for lst in KERNELS.glob("*/sources.cmake"):
        text = lst.read_text()
        assert re.search(rf"cutlass_ops_family\({lst.parent.name}\b", text), lst
        named += [lst.parent / f for f in re.findall(r"[\w.]+\.(?:cpp|cu)\b", text)]
    sources = sorted(p for p in KERNELS.glob("*/*") if p.suffix in (".cpp", ".cu"))
    assert sorted(named) == sources
