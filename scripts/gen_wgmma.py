#!/usr/bin/env python3
"""Writes the wgmma instruction wrappers of crates/moekit/kernels/wgmma.cuh
(between the BEGIN/END GENERATED markers): one specialization per activation
type and N, whose asm lists N/2 accumulator registers (an asm operand list
cannot be built by a template): `Wgmma` (A and B in shared memory) and
`WgmmaRA` (A, the weights, in registers: tc_ra.cu). Run after changing the set:
    python3 scripts/gen_wgmma.py
CI runs `python3 scripts/gen_wgmma.py --check` (exit 1 when the file differs).
"""
import pathlib
import sys

PATH = pathlib.Path(__file__).resolve().parent.parent / "crates/moekit/kernels/wgmma.cuh"
TYPES = [("__nv_bfloat16", "bf16"), ("__half", "f16")]
NS = [32, 64, 128, 256]
RA_NS = [16, 32, 64, 128, 256]
BEGIN, END = "// BEGIN GENERATED (scripts/gen_wgmma.py)\n", "// END GENERATED\n"


def wrapper(ty, ptx, n):
    nr = n // 2
    regs = ", ".join(f"%{i}" for i in range(nr))
    ops = ", ".join(f'"+f"(d[{i}])' for i in range(nr))
    return (
        f"template <> struct Wgmma<{ty}, {n}> {{\n"
        f"  __device__ static __forceinline__ void run(float (&d)[{nr}], u64 a, u64 b) {{\n"
        f"    asm volatile(\n"
        f'        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nr + 2}, 0;\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "\n'
        f'        "{{{regs}}}, "\n'
        f'        "%{nr}, %{nr + 1}, p, 1, 1, 0, 0;\\n}}\\n"\n'
        f"        : {ops}\n"
        f'        : "l"(a), "l"(b), "r"(1u));\n'
        f"  }}\n"
        f"}};\n"
    )


def wrapper_ra(ty, ptx, n):
    nr = n // 2
    regs = ", ".join(f"%{i}" for i in range(nr))
    ops = ", ".join(f'"+f"(d[{i}])' for i in range(nr))
    a = ", ".join(f"%{nr + i}" for i in range(4))
    return (
        f"template <> struct WgmmaRA<{ty}, {n}> {{\n"
        f"  __device__ static __forceinline__ void run(float (&d)[{nr}], const u32 (&a)[4], u64 b) {{\n"
        f"    asm volatile(\n"
        f'        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nr + 5}, 0;\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "\n'
        f'        "{{{regs}}}, "\n'
        f'        "{{{a}}}, %{nr + 4}, p, 1, 1, 0;\\n}}\\n"\n'
        f"        : {ops}\n"
        f'        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1u));\n'
        f"  }}\n"
        f"}};\n"
    )


def main():
    text = PATH.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    body = "".join(wrapper(ty, ptx, n) for ty, ptx in TYPES for n in NS)
    body += "".join(wrapper_ra(ty, ptx, n) for ty, ptx in TYPES for n in RA_NS)
    new = text[:start] + body + text[end:]
    if "--check" in sys.argv[1:]:
        if new != text:
            sys.exit(f"{PATH} is out of date: run python3 scripts/gen_wgmma.py")
        return
    PATH.write_text(new)


if __name__ == "__main__":
    main()
