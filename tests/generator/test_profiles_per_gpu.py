"""Profile rules are per GPU: each profiles/<gpu>/ folder gives rules for that GPU alone, so
adding a profile for one GPU leaves every other GPU's kernel choices unchanged, and a GPU
without a profile has no rules (the dispatcher's default choice; kernels/common/gpu_profile.h,
checked on the compiled dispatcher by tests/cpp/test_profile_choice.cpp).  CPU only."""
import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cutlass_ops_gen.__main__ import main as generate
from cutlass_ops_gen.manifest import instance_keys
from cutlass_ops_gen.tiles import profile_gpus, read_profile_rows, rules_from_profiles, select_tiles

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
COMMITTED = ("h100-80gb-hbm3", "h200")
NEW_GPU = "b200"  # a GPU whose (made-up) rows beat every committed row
ARGS = ["--archs", "80;90", "--kernels", "all", "--sm90-backward"]


def _keys():
    return instance_keys([80, 90], "all", True)


def _rules_by_gpu(profiles: Path) -> dict[str, list]:
    by_gpu: dict[str, list] = {}
    for key in _keys():
        for rule in select_tiles(key, profiles)[1]:
            by_gpu.setdefault(rule.gpu, []).append((key, rule))
    return by_gpu


def _faster_copy(src: Path, dst: Path, new_tile: bool) -> None:
    """src's rows at a tenth of the time (a new GPU that wins everywhere); with new_tile the
    family-80 rows with a 128x128x32 tile name a tile no committed profile has (64x32x64)."""
    with open(src, newline="") as f:
        lines = [line for line in f if not line.startswith("#")]
    reader = csv.DictReader(lines)
    rows = list(reader)
    for row in rows:
        row["Runtime"] = repr(float(row["Runtime"]) / 10)
        if new_tile and "_sm80_128x128x32_" in row["Operation"]:
            row["Operation"] = row["Operation"].replace("_128x128x32_3s_2x2w_", "_64x32x64_4s_2x1w_")
            row.update(cta_m="64", cta_n="32", cta_k="64", stages="4", warps_m="2", warps_n="1", warps_k="1")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="") as f:
        f.write(f"# cutlass_ops profile: made-up rows for {NEW_GPU}, faster than every committed one\n")
        writer = csv.DictWriter(f, fieldnames=reader.fieldnames)
        writer.writeheader()
        writer.writerows(rows)


def _with_new_gpu(tmp_path: Path) -> Path:
    profiles = tmp_path / "profiles"
    shutil.copytree(PROFILES, profiles)
    new = profiles / NEW_GPU
    # sm80.csv: the H200's fprop rows and the H100's dgrad/wgrad (and cuDNN) rows; sm90.csv: the H100's.
    _faster_copy(PROFILES / "h200" / "sm80.csv", new / "sm80.csv", new_tile=True)
    backward = tmp_path / "backward.csv"
    _faster_copy(PROFILES / "h100-80gb-hbm3" / "sm80.csv", backward, new_tile=False)
    with open(new / "sm80.csv", "a", newline="") as out:  # the same columns: rows only
        out.writelines(backward.read_text().splitlines(keepends=True)[2:])
    _faster_copy(PROFILES / "h100-80gb-hbm3" / "sm90.csv", new / "sm90.csv", new_tile=False)
    return profiles


def _table_rules_by_gpu(table: str) -> dict[str, list[str]]:
    """Per GPU of kProfileGpus, its slice of kProfileRules with kernel indices replaced by the
    kernel names (indices shift when another GPU's winners add instances)."""
    names = re.findall(r'^  \{"(cutlass_ops_[^"]+)"', table, re.M)
    rules_block = table.split("const ProfileRule kProfileRules[] = {")[1].split("};")[0]
    rows = re.findall(r"^  (\{.*\}),", rules_block, re.M)
    gpus_block = table.split("const ProfileGpu kProfileGpus[] = {")[1].split("};")[0]
    num_gpus = int(re.search(r"kNumProfileGpus = (\d+)", table).group(1))
    gpus = re.findall(r'^  \{"([^"]*)", (\d+), (\d+)\},', gpus_block, re.M)[:num_gpus]
    assert sum(int(c) for _, _, c in gpus) == int(re.search(r"kNumProfileRules = (\d+)", table).group(1))
    backward = "ConvKind::" in rules_block
    kernel_field = 8 if backward else 9  # the kKernels index among a rule's fields

    def named(row: str) -> str:
        fields = row.strip("{}").split(", ")
        index = int(fields[kernel_field])
        fields[kernel_field] = names[index] if index >= 0 else f"({index})"
        return ", ".join(fields)

    out, covered = {}, 0
    for gpu, first, count in gpus:
        assert int(first) == covered  # slices in order, no gap, no overlap
        covered += int(count)
        out[gpu] = [named(r) for r in rows[int(first):int(first) + int(count)]]
    return out


def _tables(profiles: Path, out: Path) -> dict[str, dict[str, list[str]]]:
    assert generate(ARGS + ["--profiles", str(profiles), "--out", str(out)]) == 0
    return {t: _table_rules_by_gpu((out / f"{t}_dispatch_table.cpp").read_text())
            for t in ("conv2d_fused", "conv2d_backward")}


def test_committed_profiles_are_per_gpu():
    assert profile_gpus(PROFILES) == list(COMMITTED)
    by_gpu = _rules_by_gpu(PROFILES)
    assert set(by_gpu) == set(COMMITTED)
    # As committed: the H200 measured fprop with families 80 and 90 and dgrad/wgrad with family 80
    # (cuDNN among them) and family 90; the H100 fprop with family 90 and dgrad/wgrad likewise.
    kinds = {gpu: {(k.op, k.family) for k, _ in rules} for gpu, rules in by_gpu.items()}
    assert kinds["h200"] == {("conv2d_fused", 80), ("conv2d_fused", 90), ("conv2d_dgrad", 80),
                             ("conv2d_wgrad", 80), ("conv2d_dgrad", 90), ("conv2d_wgrad", 90)}
    assert kinds["h100-80gb-hbm3"] == {("conv2d_fused", 90), ("conv2d_dgrad", 80), ("conv2d_wgrad", 80),
                                       ("conv2d_dgrad", 90), ("conv2d_wgrad", 90)}


def test_a_new_gpu_profile_leaves_other_gpus_choices_unchanged(tmp_path):
    profiles = _with_new_gpu(tmp_path)
    before, after = _rules_by_gpu(PROFILES), _rules_by_gpu(profiles)
    assert set(after) == set(COMMITTED) | {NEW_GPU} and after[NEW_GPU]
    for gpu in COMMITTED:
        assert after[gpu] == before[gpu], gpu
    # The new rows do win where pooled (as the generator once pooled every GPU's rows): the
    # test would catch a return to pooling.
    key = next(k for k in _keys() if (k.op, k.family, k.dtype, k.alignment) == ("conv2d_fused", 80, "f16", 8))
    pooled = []
    for gpu in ("h200", NEW_GPU):
        pooled += read_profile_rows(profiles / gpu / "sm80.csv", "fprop", 80)
    assert {(r.problem, r.tile) for r in rules_from_profiles(pooled, key)} != \
        {(r.problem, r.tile) for k, r in before["h200"] if k == key}
    # The tiles built are the union: the new GPU's tile is instantiated too.
    assert any(r.tile.threadblock == (64, 32, 64) for k, r in after[NEW_GPU] if r.tile is not None)

    # The generated tables: each committed GPU's slice of rules, kernels named, is the same.
    tables_before = _tables(PROFILES, tmp_path / "gen_before")
    tables_after = _tables(profiles, tmp_path / "gen_after")
    for table in tables_before:
        assert set(tables_before[table]) <= set(COMMITTED)
        for gpu in tables_before[table]:
            assert tables_after[table][gpu] == tables_before[table][gpu], (table, gpu)
    assert tables_after["conv2d_fused"][NEW_GPU] and tables_after["conv2d_backward"][NEW_GPU]
    fused = (tmp_path / "gen_after" / "conv2d_fused_dispatch_table.cpp").read_text()
    assert "cutlass_ops_conv2d_fused_f16_sm80_64x32x64_4s_2x1w_o_align8" in fused


def test_a_gpu_without_a_profile_has_no_rules(tmp_path):
    """Such a GPU is absent from kProfileGpus: the dispatcher's lookup gives it no rule at all
    (the default choice), whatever the other GPUs measured."""
    tables = _tables(PROFILES, tmp_path / "gen")
    assert set(tables["conv2d_fused"]) == set(COMMITTED)
    assert set(tables["conv2d_backward"]) == set(COMMITTED)  # both profiled dgrad/wgrad
    assert NEW_GPU not in tables["conv2d_fused"] and "a100-sxm4-80gb" not in tables["conv2d_fused"]
    # Without any profile: no GPU, no rule.
    empty = tmp_path / "none"
    empty.mkdir()
    assert generate(ARGS + ["--profiles", str(empty), "--out", str(tmp_path / "gen_none")]) == 0
    for t in ("conv2d_fused", "conv2d_backward"):
        text = (tmp_path / "gen_none" / f"{t}_dispatch_table.cpp").read_text()
        assert "kNumProfileGpus = 0" in text and "kNumProfileRules = 0" in text


def test_profile_folders_are_named_by_the_device_slug():
    """Each committed folder is the slug of the GPU named in its files' header comment (what
    profiler.py's gpu_slug and the C++ gpu_slug make of cudaDeviceProp.name)."""
    def slug(name: str) -> str:  # cutlass_ops/tools/profiler.py's gpu_slug (that module needs torch)
        name = name.lower().replace("nvidia", "").strip()
        return re.sub(r"[^a-z0-9]+", "-", name).strip("-")

    for path in PROFILES.glob("*/sm*.csv"):
        header = path.read_text().splitlines()[0]
        device = re.match(r"# cutlass_ops profile: (.+?) \(sm\d+\)", header).group(1)
        assert slug(device) == path.parent.name, path


def _cuda_include() -> Path | None:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cuda_runtime.h").is_file():
            return Path(root)
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parents[1] if nvcc and (Path(nvcc).resolve().parents[1] / "include").is_dir() else None


def _stubs(table: Path, namespace: str, signature: str) -> str:
    """A definition of every kernel the table declares that only says it can run anything: the
    choice code runs without a GPU and without compiling the kernels."""
    names = re.findall(r"^cutlass::Status (\w+)\(", table.read_text(), re.M)
    body = "\n".join(f"cutlass::Status {n}{signature} {{ return cutlass::Status::kSuccess; }}" for n in names)
    return f"namespace cutlass_ops {{ namespace {namespace} {{\n{body}\n}} }}\n"


def test_compiled_dispatcher_follows_only_the_running_gpus_rules(tmp_path):
    """tests/cpp/test_profile_choice.cpp on the real dispatchers, linked with the tables the
    generator writes for an sm90 build with every kernel and the committed profiles (and with a
    new GPU's added): kernels stubbed, so it runs on any machine with a C++ compiler and the
    CUDA runtime (skipped without them)."""
    cxx, cuda = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++"), _cuda_include()
    lib = next((cuda / d for d in ("lib64", "lib", "targets/x86_64-linux/lib") if cuda and (cuda / d / "libcudart.so").exists()), None)
    if not cxx or not cuda or not lib:
        pytest.skip("needs a C++ compiler and the CUDA runtime (headers and libcudart)")
    import cutlass_library
    cutlass = Path(cutlass_library.__file__).parent / "source" / "include"
    root = Path(__file__).resolve().parents[2]
    flags = ["-std=gnu++17", "-O0", f"-I{root / 'kernels'}", "-isystem", str(cutlass), "-isystem", str(cuda / "include")]

    def compile_(src: Path, obj: Path) -> Path:
        subprocess.run([cxx, *flags, "-c", str(src), "-o", str(obj)], check=True)
        return obj

    fused_rules = {gpu: sum(k.op == "conv2d_fused" for k, _ in rules) for gpu, rules in _rules_by_gpu(PROFILES).items()}
    common = [compile_(root / "kernels" / "conv2d_fused" / "conv2d_fused_dispatch.cpp", tmp_path / "fused.o"),
              compile_(root / "kernels" / "conv2d_backward" / "conv2d_backward_dispatch.cpp", tmp_path / "backward.o"),
              compile_(root / "tests" / "cpp" / "test_profile_choice.cpp", tmp_path / "test.o")]
    for name, profiles in (("committed", PROFILES), ("with_new_gpu", _with_new_gpu(tmp_path / "with_new_gpu"))):
        gen = tmp_path / name / "gen"
        assert generate(["--archs", "90", "--kernels", "all", "--sm90-backward", "--profiles", str(profiles),
                         "--out", str(gen)]) == 0
        fused, backward = gen / "conv2d_fused_dispatch_table.cpp", gen / "conv2d_backward_dispatch_table.cpp"
        stubs = gen / "stubs.cpp"
        stubs.write_text('#include "conv2d_fused/conv2d_fused_dispatch.h"\n'
                         '#include "conv2d_backward/conv2d_backward_dispatch.h"\n' +
                         _stubs(fused, "conv2d_fused", "(Conv2dFusedArgs const&, cudaStream_t)") +
                         _stubs(backward, "conv2d_backward", "(Conv2dBackwardArgs const&, cudaStream_t, bool)"))
        objs = [compile_(f, gen / (f.stem + ".o")) for f in (fused, backward, stubs)]
        exe = gen / "test_profile_choice"
        subprocess.run([cxx, "-o", str(exe), *map(str, common + objs), f"-L{lib}", "-lcudart", f"-Wl,-rpath,{lib}"],
                       check=True)
        run = subprocess.run([str(exe)], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.rstrip().endswith("checks failed") and "FAIL" not in run.stdout, run.stdout
        # The committed GPUs' slices keep their sizes; the new GPU's is there.
        for gpu in COMMITTED:
            assert f"{gpu} ({fused_rules[gpu]})" in run.stdout, run.stdout
        assert (f"{NEW_GPU} (" in run.stdout) == (name == "with_new_gpu")
