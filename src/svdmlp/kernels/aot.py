"""Compile the kernels for a GPU without one: every launch the public ops would make for given shapes,
with the tiles the configs pick for that GPU, built to a cubin by the ptxas that ships with Triton.

This catches what the interpreter cannot (code the compiler rejects, register spills, shared memory
over budget) on a CPU-only machine. Run it without TRITON_INTERPRET:

    python -m svdmlp.kernels.aot            # a table for Llama-like MLP shapes on an H200 (sm_90)

The launches are captured from the real launchers on meta tensors (:mod:`svdmlp.kernels.capture`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource

from svdmlp.kernels.capture import (
    KERNELS,
    QUANTIZED_LAYOUTS,
    Launch,
    captured_launches,
    corrected_launches,
    gated_mlp_launches,
    meta,
)
from svdmlp.kernels.common import is_interpreted
from svdmlp.kernels.configs import DECODE_MAX_TOKENS
from svdmlp.kernels.lowrank_linear import lowrank_linear

H200 = dict(capability=90, sms=132, max_shared=227 * 1024)
LAUNCH_OPTIONS = ("num_warps", "num_stages", "launch_pdl")


@dataclass(frozen=True)
class Compiled:
    launch: Launch
    registers: int
    spill_bytes: int
    shared_bytes: int


def compile_launch(launch: Launch, capability: int) -> Compiled:
    """Specialise the arguments as a real launch would (ints equal to 1, 16-byte alignment), compile."""
    constexprs = dict(launch.constexprs)
    signature, constants, attrs = {}, {}, {}
    for index, name in enumerate(launch.kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            constants[(index,)] = constexprs[name]
            continue
        kind, spec = native_specialize_impl(BaseBackend, launch.args[index], False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            constants[(index,)] = spec
        elif spec == "D":
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=launch.kernel, signature=signature, constexprs=constants, attrs=attrs)
    options = {key: constexprs[key] for key in LAUNCH_OPTIONS if key in constexprs}
    binary = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    registers, spills = _resource_usage(binary.asm["cubin"])
    return Compiled(launch, registers, spills, binary.metadata.shared)


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, local-memory stack bytes) of a cubin, from the bundled cuobjdump."""
    cuobjdump = triton.knobs.nvidia.cuobjdump.path
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as file:
            file.write(cubin)
        report = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True)
    fields = dict(
        item.split(":", 1) for line in report.stdout.splitlines() if "REG:" in line for item in line.split()
    )
    return int(fields["REG"]), int(fields["STACK"])


def mlp_launches(
    hidden: int, inter: int, rank: int, tokens: int, dtype: torch.dtype, sms: int
) -> list[Launch]:
    """The Triton launches of one gated MLP (all projections at ``rank``), one low-rank linear, and (at
    decode sizes) one gated MLP on int8 and on int4 factors, and a dense int4 weight with zero points
    and its low-rank correction in one pass."""
    ranks = (rank, rank, rank)
    launches = gated_mlp_launches(hidden, inter, ranks, tokens, dtype, sms)
    if tokens <= DECODE_MAX_TOKENS:  # above, quantized factors are dequantized for cuBLAS
        for layout in QUANTIZED_LAYOUTS:
            launches += gated_mlp_launches(hidden, inter, ranks, tokens, dtype, sms, quantized=layout)
        launches += corrected_launches(hidden, inter, tokens, dtype, sms)
    with captured_launches(sms) as linear:
        lowrank_linear(
            meta(tokens, hidden, dtype=dtype), meta(hidden, rank, dtype=dtype), meta(rank, inter, dtype=dtype)
        )
    return [launch for launch in launches + linear if launch.kernel is not None]


def check_shapes(
    shapes: list[tuple[int, int, int, int, torch.dtype]],
    gpu: dict = H200,
    report: Callable[[str], None] = print,
) -> list[str]:
    """Compile every distinct launch for ``shapes`` (hidden, inter, rank, tokens, dtype); return the
    problems found (a compile error, spilled registers, shared memory over the GPU's limit)."""
    if any(is_interpreted(kernel) for kernel in KERNELS):
        raise RuntimeError("compiling ahead of time needs the real kernels: unset TRITON_INTERPRET")
    problems, seen = [], set()
    for hidden, inter, rank, tokens, dtype in shapes:
        for launch in mlp_launches(hidden, inter, rank, tokens, dtype, gpu["sms"]):
            operands = tuple(str(arg.dtype) for arg in launch.args if isinstance(arg, torch.Tensor))
            key = (launch.name, operands, launch.constexprs)
            if key in seen:
                continue
            seen.add(key)
            where = f"{launch.describe()} {str(dtype)[6:]} M={tokens} ({hidden}, {inter}, r={rank})"
            try:
                compiled = compile_launch(launch, gpu["capability"])
            except Exception as error:  # noqa: BLE001 - any compiler failure is a finding
                problems.append(f"{where}: compile error {error!r:.300}")
                continue
            report(
                f"{where}: {compiled.registers} regs, {compiled.spill_bytes} B spilled, {compiled.shared_bytes} B smem"
            )
            if compiled.spill_bytes:
                problems.append(f"{where}: spills {compiled.spill_bytes} B of registers")
            if compiled.shared_bytes > gpu["max_shared"]:
                problems.append(f"{where}: {compiled.shared_bytes} B of shared memory")
    return problems


DEFAULT_SHAPES = [
    (hidden, inter, rank, tokens, dtype)
    for dtype in (torch.bfloat16, torch.float16, torch.float32)
    for hidden, inter, rank in ((4096, 14336, 1911), (2048, 8192, 984), (576, 1536, 200), (4096, 14336, 60))
    for tokens in (1, 16, 128, 2048, 8192)
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="bf16 decode and prefill of one shape only")
    args = parser.parse_args(argv)
    shapes = [(2048, 8192, 200, t, torch.bfloat16) for t in (1, 8192)] if args.quick else DEFAULT_SHAPES
    problems = check_shapes(shapes)
    for problem in problems:
        print("PROBLEM:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
