"""Narrow FlashInfer's sm90 CUTLASS fused-MoE module (what `cutlass_fused_moe` loads) to the cells named by
`scripts/flashinfer.sh --build --only CELLS`, with FlashInfer's own type switches, so that it builds in fewer
translation units.

What the cells reach (flashinfer-python 0.7.2.post1, read from its sources):
  * bf16: the binding makes CutlassMoeFCRunner<bf16, bf16>; MoeGemmRunner<bf16, bf16>'s tactics on sm90 are its
    TMA warp-specialized configs (the generated sm90 bf16 instantiations: 72, every tile and cluster shape; 4 with
    FAST_BUILD, the 128x128 tile and 1x1x1 cluster) and its Ampere configs (the generated sm80 fused-gated bf16
    launchers: 30);
  * fp8-block (`use_deepseek_fp8_block_scale`, bf16 input, fp8 weights): the binding makes
    CutlassMoeFCRunner<bf16, fp8> (only under ENABLE_FP8); its GEMMs are the fp8 block-scale GEMM of
    fp8_blockscale_gemm.cu (ENABLE_FP8_BLOCK_SCALE; DeepGEMM kernels NVRTC compiles at run time), none of the
    generated instantiations.
The binding, the runners' instantiation unit and the dispatcher instantiate every runner their ENABLE_* switches
allow (fp16, fp32 and integer-weight ones have no switch), and the dispatcher takes the address of every launcher of
a runner it compiles, whatever the tactic. So the narrowing is by switch, not by tactic:
  * the module's nvcc flags lose the ENABLE_* switches no named cell needs (ENABLE_FP4 always: FlashInfer's own
    sm89 module is built so; ENABLE_FP8 and ENABLE_FP8_BLOCK_SCALE without fp8-block);
  * a generated instantiation is kept when it is a grouped GEMM (the dense fpA_intB GEMM launchers are included by
    no unit of this module) whose element types are all enabled (the generator's own guard map: bf16 needs
    ENABLE_BF16, e4m3 ENABLE_FP8, e2m1 ENABLE_FP4);
  * a unit made only of explicit `template class` instantiations is dropped when none survives its #if guards
    under the kept switches (the moe_gemm_kernels_<act>_<weight>.cu runners of disabled types).
FAST_BUILD (--fast) changes no unit count: the dispatcher still references every launcher; the other tiles compile
to stubs that throw.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SWITCHES = ("ENABLE_BF16", "ENABLE_FP8", "ENABLE_FP8_BLOCK_SCALE", "ENABLE_FP4")
CELLS: dict[str, frozenset[str]] = {
    "bf16": frozenset({"ENABLE_BF16"}),
    "fp8-block": frozenset({"ENABLE_BF16", "ENABLE_FP8", "ENABLE_FP8_BLOCK_SCALE"}),
}
#: the generator's guard map (generate_kernels.py): the switch an element type needs
TYPE_SWITCH = {"bf16": "ENABLE_BF16", "e4m3": "ENABLE_FP8", "e2m1": "ENABLE_FP4"}
#: the launchers and runners a narrowed build must still define (checked on the linked module)
MUST_DEFINE = re.compile(r"kernelLauncher|MoeGemmRunner<|CutlassMoeFCRunner<")

_DIRECTIVE = re.compile(r"^\s*#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)$")
_DEFINED = re.compile(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)")


def parse_cells(text: str) -> tuple[str, ...]:
    """`bf16,fp8-block` -> the named cells, in CELLS' order; a clear error for anything else."""
    names = [c.strip() for c in text.split(",")]
    bad = [c for c in names if c not in CELLS]
    if not text.strip() or bad:
        raise ValueError(f"--only takes a comma-separated list of {', '.join(CELLS)}; not {text!r}"
                         + (f" ({', '.join(map(repr, bad))} unknown)" if bad else ""))
    return tuple(c for c in CELLS if c in names)


def switches(cells: Iterable[str]) -> frozenset[str]:
    """The ENABLE_* switches the named cells need."""
    return frozenset().union(*(CELLS[c] for c in cells))


def narrow_flags(flags: list[str], on: frozenset[str]) -> list[str]:
    """The module's nvcc flags without the -DENABLE_* switches that are not `on`."""
    off = {f"-D{s}" for s in SWITCHES if s not in on}
    return [f for f in flags if f not in off]


def _type_names(op: Any) -> list[str]:
    """Element type names of a generated operation (sm90 launchers name five, sm80 fused launchers one); the
    generator's e2m1 is an instance of its class e2m1_type, the others members of cutlass_library.DataType."""
    types = [op.dtype] if hasattr(op, "dtype") else \
        [op.act_type, op.weight_type, op.scalezero_type, op.bias_type, op.output_type]
    return [getattr(t, "name", type(t).__name__.removesuffix("_type")) for t in types]


def keep_operation(op: Any, on: frozenset[str]) -> bool:
    """Whether a generated instantiation stays: a grouped GEMM whose element types are all enabled."""
    if op.gemm_kind.name != "Grouped":
        return False
    return all(TYPE_SWITCH[t] in on for t in _type_names(op) if t in TYPE_SWITCH)


def _truth(expr: str, on: frozenset[str]) -> bool | None:
    """An #if expression of `defined(SWITCH)` joined by &&, || and !; None when it tests anything else."""
    expr = re.sub(r"/\*.*?\*/|//.*", "", expr)
    names = [a or b for a, b in _DEFINED.findall(expr)]
    if any(n not in SWITCHES for n in names):
        return None
    py = _DEFINED.sub(lambda m: f" {(m.group(1) or m.group(2)) in on} ", expr)
    py = py.replace("&&", " and ").replace("||", " or ").replace("!", " not ")
    if not re.fullmatch(r"[\s()]*(?:(?:True|False|and|or|not)[\s()]*)*", py) or not py.strip():
        return None
    return bool(eval(py, {"__builtins__": {}}))  # safe: only True, False, and, or, not and parentheses remain


def _active_code(text: str, on: frozenset[str]) -> str | None:
    """The code the preprocessor keeps under the switches `on` (directives dropped); None if a guard is unknown."""
    stack: list[tuple[bool, bool]] = []  # (this branch is live, a branch of this #if was taken)
    kept = []
    for line in text.splitlines():
        m = _DIRECTIVE.match(line)
        outer = all(live for live, _ in stack)
        if not m:
            if outer:
                kept.append(line)
            continue
        kind, rest = m.groups()
        if kind in ("ifdef", "ifndef"):
            name = rest.strip()
            if name not in SWITCHES:
                return None
            live = (name in on) == (kind == "ifdef")
            stack.append((live, live))
        elif kind in ("if", "elif"):
            truth = _truth(rest, on)
            if truth is None:
                return None
            taken = stack.pop()[1] if kind == "elif" else False
            stack.append((truth and not taken, taken or truth))
        elif kind == "else":
            taken = stack.pop()[1]
            stack.append((not taken, True))
        else:
            stack.pop()
    return "\n".join(kept)


def _statements(code: str) -> list[str]:
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    code = "\n".join(ln for ln in re.sub(r"//.*", "", code).splitlines() if not ln.lstrip().startswith("#"))
    code = re.sub(r"namespace\s+[\w:]+\s*\{|\}", "", code)
    return [" ".join(s.split()) for s in code.split(";") if s.strip()]


def keep_source(path: Path | str, on: frozenset[str], text: str | None = None) -> bool:
    """Whether a source unit stays: all do, except a unit of explicit `template class` instantiations only, none
    of which survives its #if guards under the switches `on`."""
    path = Path(path)
    if path.suffix != ".cu" or path.name.endswith(".generated.cu"):
        return True
    text = path.read_text(encoding="utf-8", errors="replace") if text is None else text
    every = _statements(text)
    if not every or not all(s.startswith("template class ") for s in every):
        return True
    active = _active_code(text, on)
    return active is None or bool(_statements(active))


def install(cells: Iterable[str]) -> frozenset[str]:
    """Patch FlashInfer's generator and module spec (in this process) so that gen_cutlass_fused_moe_*_module
    writes and lists only what the cells need. Returns the switches kept."""
    import flashinfer.jit.fused_moe as fm
    import flashinfer.jit.gemm.cutlass.generate_kernels as gk

    on = switches(cells)
    for name in ("generate_sm90_operations", "generate_sm80_operations"):
        whole = getattr(gk, name)
        setattr(gk, name, lambda enabled, _whole=whole: [op for op in _whole(enabled) if keep_operation(op, on)])
    whole_module = fm.gen_cutlass_fused_moe_module

    def narrowed(nvcc_flags: list[str], *args: Any, **kwargs: Any) -> Any:
        spec = whole_module(narrow_flags(nvcc_flags, on), *args, **kwargs)
        spec.sources = [s for s in spec.sources if keep_source(s, on)]
        return spec

    fm.gen_cutlass_fused_moe_module = narrowed
    return on


def undefined_launchers(library: Path | str) -> list[str] | None:
    """Launchers and runners the linked module uses but does not define (demangled); None without `nm`."""
    try:
        out = subprocess.run(["nm", "-DC", "--undefined-only", str(library)], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [ln.split(None, 1)[-1] for ln in out.splitlines() if MUST_DEFINE.search(ln)]


if __name__ == "__main__":  # `python flashinfer_only.py CELLS`: print the cells, or say why they are not valid
    try:
        print(",".join(parse_cells(sys.argv[1] if len(sys.argv) > 1 else "")))
    except ValueError as e:
        print(f"flashinfer.sh: {e}", file=sys.stderr)
        sys.exit(2)
