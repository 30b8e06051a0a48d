"""Compiles decodelab's Triton kernels for an H100 (sm_90) on any machine, without a GPU: Triton
builds the kernel's IR and PTX and runs its bundled ptxas, so what only a GPU would otherwise
catch (a name the JIT cannot resolve, a type it rejects) fails here. Run by
tests/test_attention.py with the Triton of `make kernel-tools`, not under its interpreter."""

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from decodelab.engines.cuda import attention, matvec

H100 = GPUTarget("cuda", 90, 32)
HALF = 0.5  # a plain global: what a jitted function may not read (the control below)


@triton.jit
def control_kernel(x, B: tl.constexpr):
    """Negative control: reads HALF, which the interpreter allows and the compiler refuses."""
    i = tl.arange(0, B)
    tl.store(x + i, tl.load(x + i) * HALF)


def compile_for_h100(kernel, pointers: dict[str, str], constexprs: dict, floats=()) -> None:
    """`kernel` with `pointers` (name: type), `constexprs`, `floats` fp32 and the rest int32."""
    kinds = {name: "constexpr" if name in constexprs else pointers.get(name) or (
        "fp32" if name in floats else "i32") for name in kernel.arg_names}
    triton.compile(ASTSource(kernel, kinds, constexprs=constexprs), target=H100,
                   options={"num_warps": 4})


def main() -> None:
    half = dict.fromkeys(("x", "w", "b", "r", "out", "d", "s_out", "g", "beta"), "*fp16")
    for gelu, residual in ((False, False), (True, False), (False, True)):
        compile_for_h100(matvec.matvec_kernel, half, {"BN": matvec.BN, "BK": matvec.BLOCK_K,
                                                      "BIAS": True, "GELU": gelu,
                                                      "RESIDUAL": residual})
    for add in (False, True):
        compile_for_h100(matvec.norm_matvec_kernel, half,
                         {"BN": matvec.BN, "KP": 2048, "ADD": add, "GELU": add}, floats=("eps",))
    for ends in (False, True):  # a boolean mask, or each row's count of slots seen
        pointers = dict.fromkeys(("q", "k", "v", "out", "new_k", "new_v"), "*fp16") | {
            "keep": "*i64" if ends else "*i1", "best_out": "*fp32", "total_out": "*fp32",
            "position": "*i64"}
        for split in (False, True):
            compile_for_h100(attention.attend_kernel, pointers,
                             {"D": 64, "BLOCK": attention.BLOCK, "SPLIT": split, "ENDS": ends},
                             floats=("scale",))
            if ends:  # a token writing its own slot
                compile_for_h100(attention.write_attend_kernel, pointers,
                                 {"D": 64, "BLOCK": attention.BLOCK, "SPLIT": split},
                                 floats=("scale",))
            compile_for_h100(attention.attend_rows_kernel, pointers,
                             {"D": 64, "R": 16, "BLOCK": attention.BLOCK, "SPLIT": split,
                              "IEEE": False, "ENDS": ends}, floats=("scale",))
    compile_for_h100(attention.combine_kernel, dict.fromkeys(("parts", "best", "total"), "*fp32")
                     | {"out": "*fp16"}, {"D": 64, "PARTS": 8})
    try:
        compile_for_h100(control_kernel, {"x": "*fp32"}, {"B": 16})
    except triton.CompilationError:
        print("compiled")
    else:
        raise SystemExit("the control kernel compiled: this check catches nothing")


if __name__ == "__main__":
    main()
