"""The README and docs/ stay a manual that matches the tree: short README, links and quoted
repository paths that exist, CLI commands that exist, no work-log numbers, no tracked logs.

Pure text checks: runs on the CPU without the compiled library and never imports cutlass_ops
(the CLI's subcommands are read from cutlass_ops/__main__.py's source with ast).
"""
import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 300

# Top-level entries a backticked path may start with to count as a repository path.  Anything
# else in backticks (code, shapes, kernel names, env assignments) is not checked.
REPO_ROOTS = ("profiles/", "python/", "cmake/", "kernels/", "cutlass_ops/", "tests/", "docs/",
              "examples/", ".ci/")
REPO_FILES = ("README.md", "CMakeLists.txt", "pyproject.toml")
# Build outputs and other paths that are documented but never in git (they exist only after a
# build or a run): a quoted path under one of these prefixes is not checked.
BUILD_TREE_ALLOWLIST = (
    "build/",                 # the CMake build tree (generated sources: build/.../generated/)
    "dist/",                  # wheels and sdists
    "bench_results/",         # `bench` output
    "gpu_results/",           # tests/gpu_*.sh output without $OUT
    "cutlass_ops/mlp_aot/",   # FusedMLP's ahead-of-time kernels, compiled into the installed package
)
WORK_LOG = re.compile(r"[Ss]ession ?[0-9]|[Ii]ssue ?[0-9]")


def _docs() -> list[Path]:
    return [README] + sorted((ROOT / "docs").rglob("*.md"))


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return out.splitlines()


def _strip_code_blocks(text: str) -> str:
    """The text outside ``` fences (links are not resolved inside code)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; the limit is {README_MAX_LINES} (move detail to docs/)"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _links(text: str) -> list[str]:
    return [a or b for a, b in LINK.findall(_strip_code_blocks(text))]


def test_relative_links_resolve():
    missing = []
    for doc in _docs():
        for target in _links(doc.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http(s):, mailto:, an anchor in the same file
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: ({target})")
    assert not missing, "links to missing files:\n  " + "\n  ".join(missing)


BACKTICKED = re.compile(r"`([^`\n]+)`")


def _repo_path(token: str):
    """The repository path a backticked token names, or None when it is not one: a single word
    starting with a top-level folder (or a top-level file), without placeholders or globs."""
    token = token.strip()
    if " " in token or any(c in token for c in "<>{}*?$|=,()[]'\""):
        return None
    if token in REPO_FILES:
        return token
    if not token.startswith(REPO_ROOTS):
        return None
    if token.startswith(BUILD_TREE_ALLOWLIST):
        return None
    return token.split(":", 1)[0]  # `path:factory`-style references name the file before the colon


def test_quoted_repository_paths_exist():
    missing = []
    for doc in _docs():
        for token in BACKTICKED.findall(doc.read_text()):
            path = _repo_path(token)
            if path is not None and not (ROOT / path.rstrip("/")).exists():
                missing.append(f"{doc.relative_to(ROOT)}: `{token}`")
    assert not missing, "quoted repository paths that do not exist:\n  " + "\n  ".join(sorted(set(missing)))


def test_repo_path_recognizer():
    """The recognizer checks paths and leaves prose, code, placeholders and build outputs alone."""
    assert _repo_path("kernels/conv2d_fused/") == "kernels/conv2d_fused/"
    assert _repo_path("tests/run.sh") == "tests/run.sh"
    assert _repo_path("docs/x.md") == "docs/x.md"
    assert _repo_path("README.md") == "README.md"
    for not_a_path in ("profiles/<gpu>/sm80.csv", "kernels/<family>/", "build/gen/generated/x.cu",
                       "torch.ops.cutlass_ops.conv2d_fused", "conv2d_fused(x, w)", "80;86;90",
                       "CUTLASS_OPS_ARCHS=80", "python -m cutlass_ops bench", "cutlass_ops/mlp_aot/k/fused_mlp.so",
                       "$CUTLASS_OPS_CACHE/mlp/<hash>", "relu(z) + post_bias", "ops.py"):
        assert _repo_path(not_a_path) is None, not_a_path


def _cli_names() -> tuple[set, set]:
    """(subcommands, bench targets) from cutlass_ops/__main__.py's source: every
    ``<parser>.add_parser("name", ...)`` and the choices of the ``what`` argument of ``bench``."""
    tree = ast.parse((ROOT / "cutlass_ops" / "__main__.py").read_text())
    subs, bench = set(), set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        if node.func.attr == "add_parser":
            subs.add(first.value)
        elif node.func.attr == "add_argument" and first.value == "what":
            for kw in node.keywords:
                if kw.arg == "choices" and isinstance(kw.value, (ast.List, ast.Tuple)):
                    bench |= {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
    return subs, bench


CLI = re.compile(r"(?:python3? (?:-P )?-m cutlass_ops|cutlass-ops)[ \t]+([a-z][a-z0-9-]*)(?:[ \t]+([a-z][a-z0-9-]*))?")


def test_quoted_cli_commands_exist():
    subs, bench = _cli_names()
    assert {"bench", "info", "demo"} <= subs, f"could not read the subcommands of cutlass_ops/__main__.py: {subs}"
    assert {"resnet", "train"} <= bench, f"could not read bench's targets: {bench}"
    wrong = []
    for doc in _docs():
        for sub, arg in CLI.findall(doc.read_text()):
            if sub not in subs:
                wrong.append(f"{doc.relative_to(ROOT)}: `{sub}` is not a subcommand ({sorted(subs)})")
            elif sub == "bench" and arg and arg not in bench:
                wrong.append(f"{doc.relative_to(ROOT)}: `bench {arg}` is not a bench target ({sorted(bench)})")
    assert not wrong, "\n  ".join(wrong)


def test_no_work_log_numbers():
    found = [f"{doc.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
             for doc in _docs() for i, line in enumerate(doc.read_text().splitlines(), 1) if WORK_LOG.search(line)]
    found += [f"file name: {p}" for p in _tracked() if p.startswith(("docs/", "README")) and WORK_LOG.search(p)]
    assert not found, "work-log numbers (say what and why; git log says when):\n  " + "\n  ".join(found)


def test_no_tracked_logs():
    logs = [p for p in _tracked() if p.endswith(".log")]
    assert not logs, f"tracked .log files: {logs}"
