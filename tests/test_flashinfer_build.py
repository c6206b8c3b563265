"""scripts/flashinfer.sh --only: the rule that narrows FlashInfer's sm90 fused-MoE module to the named cells
(scripts/flashinfer_only.py), on synthetic generator operations and source units shaped like FlashInfer's, and a
whole `--build --dry-run` on a tiny synthetic bundle whose stand-in of flashinfer.jit has FlashInfer's structure
(the spec function calls the generator, which looks its operation lists up by module name)."""

from __future__ import annotations

import enum
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("flashinfer_only", ROOT / "scripts" / "flashinfer_only.py")
fo = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fo)  # type: ignore[union-attr]

BF16 = frozenset({"ENABLE_BF16"})
FP8_BLOCK = frozenset({"ENABLE_BF16", "ENABLE_FP8", "ENABLE_FP8_BLOCK_SCALE"})
EVERY = frozenset(fo.SWITCHES)


class DataType(enum.Enum):  # names as in FlashInfer's cutlass_library.DataType
    bf16 = 1
    f16 = 2
    f32 = 3
    e4m3 = 4
    u4 = 5
    ue8m0 = 6


class e2m1_type:  # the generator's own spelling of its fp4 type's class
    pass


class GemmKind(enum.Enum):
    Gemm = 1
    Grouped = 2


def op(kind: str, act: object, weight: object, scale: object, bias: object, out: object) -> SimpleNamespace:
    return SimpleNamespace(gemm_kind=GemmKind[kind], act_type=act, weight_type=weight, scalezero_type=scale,
                           bias_type=bias, output_type=out)


T = DataType
E2M1 = e2m1_type()


@pytest.mark.parametrize("operation, kept_bf16, kept_fp8_block, kept_every", [
    (op("Grouped", T.bf16, T.bf16, T.bf16, T.bf16, T.bf16), True, True, True),
    (op("Grouped", T.f16, T.f16, T.f16, T.f16, T.f16), True, True, True),  # no switch: its runner always exists
    (op("Grouped", T.f32, T.f32, T.f32, T.f32, T.f32), True, True, True),
    (op("Grouped", T.e4m3, T.e4m3, T.e4m3, T.e4m3, T.bf16), False, True, True),
    (op("Grouped", T.e4m3, T.u4, T.f16, T.f16, T.f16), False, True, True),
    (op("Grouped", T.bf16, E2M1, T.ue8m0, T.bf16, T.bf16), False, False, True),
    (op("Grouped", T.e4m3, E2M1, T.ue8m0, T.f16, T.f16), False, False, True),
    (op("Gemm", T.bf16, T.u4, T.bf16, T.bf16, T.bf16), False, False, False),  # dense fpA_intB: no unit includes it
    (SimpleNamespace(gemm_kind=GemmKind.Grouped, dtype=T.bf16), True, True, True),  # sm80 fused grouped GEMM
    (SimpleNamespace(gemm_kind=GemmKind.Grouped, dtype=T.f16), True, True, True),
])
def test_a_generated_instantiation_stays_when_its_kind_and_types_are_enabled(
        operation: SimpleNamespace, kept_bf16: bool, kept_fp8_block: bool, kept_every: bool) -> None:
    got = [fo.keep_operation(operation, on) for on in (BF16, FP8_BLOCK, EVERY)]
    assert got == [kept_bf16, kept_fp8_block, kept_every]


# units shaped like FlashInfer's moe_gemm_kernels_<act>_<weight>.cu (license comment, includes, namespace)
HEAD = '/*\n * Copyright\n */\n\n#include "moe_gemm_template_dispatch.h"\n\nnamespace a::b {\n'
FP4_FP4 = HEAD + ("#ifdef ENABLE_FP4\ntemplate class R<Fp4Type, Fp4Type, half>;\n#ifdef ENABLE_BF16\n"
                  "template class R<Fp4Type, Fp4Type, __nv_bfloat16>;\n#endif\n#endif\n}  // namespace a::b\n")
BF16_FP4 = HEAD + ("#if defined(ENABLE_BF16) && defined(ENABLE_FP4)\ntemplate class R<bf, Fp4Type,\n    bf>;\n"
                   "#endif\n}\n")
FP8_FP8 = HEAD + "#ifdef ENABLE_FP8\ntemplate class R<fp8, fp8, half>;\n// template class R<e5m2, e5m2>;\n#endif\n}\n"
FP16 = HEAD + "template class R<half, half, half>;\n}\n"
ELSE = HEAD + "#if !defined(ENABLE_FP8)\n#else\ntemplate class R<fp8, fp8, half>;\n#endif\n}\n"
OTHER_GUARD = HEAD + "#ifdef COMPILE_HOPPER_TMA_GEMMS\ntemplate class R<fp8, fp8, half>;\n#endif\n}\n"
CODE = HEAD + "#ifdef ENABLE_FP4\ntemplate class R<Fp4Type, Fp4Type, half>;\n#endif\nvoid launch() {}\n}\n"


@pytest.mark.parametrize("name, text, kept_bf16, kept_fp8_block, kept_every", [
    ("moe_gemm_kernels_fp4_fp4.cu", FP4_FP4, False, False, True),
    ("moe_gemm_kernels_bf16_fp4.cu", BF16_FP4, False, False, True),
    ("moe_gemm_kernels_fp8_fp8.cu", FP8_FP8, False, True, True),
    ("moe_gemm_kernels_fp16_fp16.cu", FP16, True, True, True),
    ("else_branch.cu", ELSE, False, True, True),
    ("other_guard.cu", OTHER_GUARD, True, True, True),  # a guard it cannot evaluate: kept
    ("binding.cu", CODE, True, True, True),  # not only instantiations: kept
    ("x.generated.cu", FP4_FP4, True, True, True),  # generated units are narrowed by operation, not here
    ("logger.cpp", FP4_FP4, True, True, True),
])
def test_a_unit_of_instantiations_goes_when_none_survives_its_guards(
        name: str, text: str, kept_bf16: bool, kept_fp8_block: bool, kept_every: bool) -> None:
    got = [fo.keep_source(Path(name), on, text=text) for on in (BF16, FP8_BLOCK, EVERY)]
    assert got == [kept_bf16, kept_fp8_block, kept_every]


def test_cells_name_their_switches_and_flags_lose_the_others() -> None:
    assert fo.parse_cells("fp8-block,bf16") == ("bf16", "fp8-block")
    assert fo.switches(["bf16"]) == BF16 and fo.switches(["bf16", "fp8-block"]) == FP8_BLOCK
    flags = ["-DENABLE_BF16", "-DENABLE_FP8", "-DENABLE_FP8_BLOCK_SCALE", "-DENABLE_FP4", "-DUSING_OSS", ""]
    assert fo.narrow_flags(flags, BF16) == ["-DENABLE_BF16", "-DUSING_OSS", ""]
    assert fo.narrow_flags(flags, FP8_BLOCK) == [*flags[:3], "-DUSING_OSS", ""]
    for bad in ("", "fp4", "bf16,nope", "bf16;fp8-block"):
        with pytest.raises(ValueError, match=r"--only takes a comma-separated list of bf16, fp8-block"):
            fo.parse_cells(bad)


# the synthetic bundle: a stand-in of the parts of flashinfer.jit that --build uses, with FlashInfer's structure
STUB = {
    "__init__.py": '__version__ = "0.0+synthetic"\n',
    "jit/__init__.py": "",
    "jit/gemm/__init__.py": "",
    "jit/gemm/cutlass/__init__.py": "",
    "jit/env.py": """import os, pathlib
_base = pathlib.Path(os.environ["FLASHINFER_WORKSPACE_BASE"])
_root = pathlib.Path(__file__).resolve().parents[1]
FLASHINFER_JIT_DIR, FLASHINFER_GEN_SRC_DIR = _base / "cached_ops", _base / "generated"
FLASHINFER_CSRC_DIR, FLASHINFER_AOT_DIR = _root / "data" / "csrc", _root / "data" / "aot"
""",
    "jit/gemm/cutlass/generate_kernels.py": """import enum
class DataType(enum.Enum):
    bf16 = 1; f16 = 2; e4m3 = 3; u4 = 4; ue8m0 = 5
class e2m1_type:
    pass
e2m1 = e2m1_type()
class GemmKind(enum.Enum):
    Gemm = 1; Grouped = 2
class Op:
    def __init__(self, kind, act, weight, out):
        self.gemm_kind, self.act_type, self.weight_type = kind, act, weight
        self.scalezero_type, self.bias_type, self.output_type = weight, out, out
class Sm80Op:
    def __init__(self, dtype):
        self.gemm_kind, self.dtype = GemmKind.Grouped, dtype
T, G = DataType, GemmKind
def generate_sm90_operations(enabled):
    return [Op(G.Gemm, T.bf16, T.u4, T.bf16), Op(G.Grouped, T.bf16, T.bf16, T.bf16),
            Op(G.Grouped, T.f16, T.f16, T.f16), Op(G.Grouped, T.e4m3, T.e4m3, T.bf16),
            Op(G.Grouped, T.e4m3, T.u4, T.f16), Op(G.Grouped, T.bf16, e2m1, T.bf16)]
def generate_sm80_operations(enabled):
    return [Sm80Op(T.bf16), Sm80Op(T.f16)]
def generate_gemm_operations(output_dir, architectures):  # as FlashInfer's: unchanged files are not rewritten
    output_dir.mkdir(parents=True, exist_ok=True)
    files = set()
    for i, op in enumerate(generate_sm90_operations(True) + generate_sm80_operations(True)):
        names = "_".join(getattr(t, "name", "e2m1") for t in
                         ([op.dtype] if hasattr(op, "dtype") else [op.act_type, op.weight_type, op.output_type]))
        path = output_dir / f"op{i}_{op.gemm_kind.name}_{names}.generated.cu"
        files.add(path)
        if not path.exists() or path.read_text() != "INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM(x);\\n":
            path.write_text("INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM(x);\\n")
    for path in set(output_dir.iterdir()) - files:
        path.unlink()
""",
    "jit/fused_moe.py": """from . import env as jit_env
from .gemm.cutlass.generate_kernels import generate_gemm_operations
class Spec:
    def __init__(self, name, sources, flags):
        self.name, self.sources, self.flags = name, sources, flags
        self.build_dir = jit_env.FLASHINFER_JIT_DIR / name
        self.ninja_path, self.jit_library_path = self.build_dir / "build.ninja", self.build_dir / f"{name}.so"
    def write_ninja(self):  # a real ninja file: each unit takes a moment, the link makes a shared library
        self.build_dir.mkdir(parents=True, exist_ok=True)
        lines = ["# flags " + " ".join(self.flags), "rule cc",
                 "  command = if grep -q BROKEN $in; then echo $in: error: a broken unit; exit 1; fi; "
                 "sleep 0.3 && echo > $out # " + "long-nvcc-flags " * 200,
                 "rule link", "  command = c++ -shared -fPIC -x c++ /dev/null -o $out"]
        lines += [f"build {s.name}.o: cc {s}" for s in self.sources]
        lines += [f"build {self.name}.so: link " + " ".join(f"{s.name}.o" for s in self.sources),
                  f"default {self.name}.so", ""]
        self.ninja_path.write_text("\\n".join(lines))
def gen_cutlass_fused_moe_sm90_module(use_fast_build=False):
    flags = ["-DCOMPILE_HOPPER_TMA_GEMMS", "-DENABLE_BF16", "-DENABLE_FP8", "-DENABLE_FP8_BLOCK_SCALE",
             "-DENABLE_FP4"]
    return gen_cutlass_fused_moe_module(flags, "90", use_fast_build)
def gen_cutlass_fused_moe_module(nvcc_flags, device_arch, use_fast_build=False, module_name=None):
    out = jit_env.FLASHINFER_GEN_SRC_DIR / "cutlass_instantiations" / device_arch
    generate_gemm_operations(out, f"{device_arch};{device_arch}-real")
    sources = sorted(jit_env.FLASHINFER_CSRC_DIR.glob("*.cu")) + sorted(out.rglob("*.generated.cu"))
    return Spec(module_name or f"fused_moe_{device_arch}", sources + [jit_env.FLASHINFER_CSRC_DIR / "logger.cpp"],
                nvcc_flags)
""",
    "data/csrc/moe_gemm_kernels_bf16_bf16.cu": HEAD + "#ifdef ENABLE_BF16\ntemplate class R<bf, bf, bf>;\n#endif\n}\n",
    "data/csrc/moe_gemm_kernels_fp16_fp16.cu": FP16,
    "data/csrc/moe_gemm_kernels_fp8_fp8.cu": FP8_FP8,
    "data/csrc/moe_gemm_kernels_fp4_fp4.cu": FP4_FP4,
    "data/csrc/binding.cu": CODE,
    "data/csrc/logger.cpp": "int x;\n",
}


def bundle(folder: Path, files: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True)
    with tarfile.open(folder / "flashinfer-bundle.tar.xz", "w:xz") as tar:
        for name, text in (files or STUB).items():
            data = text.encode()
            info = tarfile.TarInfo(f"site/flashinfer/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return folder


def build(folder: Path, *args: str, jobs: int = 4) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_HOME": str(folder / "no-cuda"), "MAX_JOBS": str(jobs)}
    env.pop("FLASHINFER_CUDA_ARCH_LIST", None)
    return subprocess.run(["bash", str(ROOT / "scripts" / "flashinfer.sh"), "--build", "--dir", str(folder), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def dry_run(folder: Path, *args: str) -> tuple[str, list[str], list[str]]:
    """The script's output, and the flags and sources of the build.ninja it wrote."""
    done = build(folder, "--dry-run", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    ninja = Path(re.search(r"wrote (\S+build\.ninja)", done.stdout).group(1)).read_text().splitlines()
    units = [Path(line.split()[3]).name for line in ninja if line.startswith("build ") and ": cc " in line]
    return done.stdout, ninja[0].split()[2:], sorted(units)


def test_a_dry_run_narrows_the_synthetic_module_to_the_cells(tmp_path: Path) -> None:
    folder = bundle(tmp_path / "fi")
    out, flags, units = dry_run(folder)
    assert "14 translation units (13 .cu of which 8 generated" in out and "-DENABLE_FP4" in flags
    assert len(units) == 14 and f"{folder}/ws/" in out
    out, flags, units = dry_run(folder, "--only", "fp8-block,bf16")
    assert "11 translation units (10 .cu of which 6 generated, holding 6 CUTLASS" in out, out
    assert flags == ["-DCOMPILE_HOPPER_TMA_GEMMS", "-DENABLE_BF16", "-DENABLE_FP8", "-DENABLE_FP8_BLOCK_SCALE"]
    assert units == sorted([
        "binding.cu", "logger.cpp", "moe_gemm_kernels_bf16_bf16.cu", "moe_gemm_kernels_fp16_fp16.cu",
        "moe_gemm_kernels_fp8_fp8.cu", "op0_Grouped_bf16_bf16_bf16.generated.cu",
        "op1_Grouped_f16_f16_f16.generated.cu", "op2_Grouped_e4m3_e4m3_bf16.generated.cu",
        "op3_Grouped_e4m3_u4_f16.generated.cu", "op4_Grouped_bf16.generated.cu", "op5_Grouped_f16.generated.cu"])
    assert f"{folder}/ws-only-bf16+fp8-block/" in out
    out, flags, units = dry_run(folder, "--only", "bf16")
    assert flags == ["-DCOMPILE_HOPPER_TMA_GEMMS", "-DENABLE_BF16"]
    assert units == sorted([
        "binding.cu", "logger.cpp", "moe_gemm_kernels_bf16_bf16.cu", "moe_gemm_kernels_fp16_fp16.cu",
        "op0_Grouped_bf16_bf16_bf16.generated.cu", "op1_Grouped_f16_f16_f16.generated.cu",
        "op2_Grouped_bf16.generated.cu", "op3_Grouped_f16.generated.cu"])


@pytest.mark.skipif(shutil.which("ninja") is None or shutil.which("c++") is None,
                    reason="needs ninja and c++ (on the GPU machine the bundle brings its own ninja)")
def test_a_narrowed_build_goes_on_where_the_time_limit_stopped_it_and_installs_the_module(tmp_path: Path) -> None:
    folder = bundle(tmp_path / "fi")
    first = build(folder, "--only", "bf16,fp8-block", "--time-limit", "1", jobs=1)
    assert first.returncode == 3 and "stopped at the time limit" in first.stdout, first.stdout + first.stderr
    before = int(re.search(r"compiled (\d+) translation units", first.stdout).group(1))
    assert 1 <= before < 11
    second = build(folder, "--only", "bf16,fp8-block")
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"compiled {11 - before} translation units" in second.stdout, second.stdout
    aot = folder / "pkg" / "site" / "flashinfer" / "data" / "aot" / "fused_moe_90"
    assert (aot / "fused_moe_90.so").is_file() and (aot / "BUILT").read_text() == "only bf16,fp8-block\n"
    assert "no launcher missing" in second.stdout
    again = build(folder, "--only", "bf16,fp8-block")
    assert again.returncode == 0 and "compiled 0 translation units" in again.stdout, again.stdout + again.stderr


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("c++") is None, reason="needs nm and c++")
def test_the_link_check_names_a_launcher_the_module_uses_but_lacks(tmp_path: Path) -> None:
    code = ("template <class T> void tma_kernelLauncher(T);\n"
            "{define}void dispatch() {{ tma_kernelLauncher<int>(1); }}\n")
    found = {}
    for name, define in (("whole", "template <class T> void tma_kernelLauncher(T) {}\n"), ("narrowed", "")):
        src, lib = tmp_path / f"{name}.cc", tmp_path / f"{name}.so"
        src.write_text(code.format(define=define))
        subprocess.run(["c++", "-shared", "-fPIC", "-O0", str(src), "-o", str(lib)], check=True, timeout=60)
        found[name] = fo.undefined_launchers(lib)
    assert found == {"whole": [], "narrowed": ["void tma_kernelLauncher<int>(int)"]}


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja (on the GPU machine the bundle brings its own)")
def test_a_failed_unit_is_named_with_its_message(tmp_path: Path) -> None:
    # the units still running when one fails print their long command lines after its message (nvcc's are KBs)
    broken = {**STUB, "data/csrc/moe_gemm_kernels_bf16_bf16.cu": STUB["data/csrc/moe_gemm_kernels_bf16_bf16.cu"]
              + "BROKEN\n"}
    done = build(bundle(tmp_path / "fi", broken), "--only", "bf16")
    assert done.returncode not in (0, 3), done.stdout + done.stderr
    assert "FAILED:" in done.stdout and "moe_gemm_kernels_bf16_bf16.cu: error: a broken unit" in done.stdout, (
        done.stdout[-3000:])
