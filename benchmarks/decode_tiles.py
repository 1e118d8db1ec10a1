"""Time each decode launch of the fused MLP under a handful of tile variants, on the device (issue 17).

The planner picks decode tiles from a model of bytes in flight (``svdmlp.kernels.configs``); the first
device run measured the fused decode chain at about half of its HBM floor, and the per-launch event
timings of that run were set by the host, not the device. This script settles the tiles by
measurement: for each model at M = 1 and 16 (keep 0.8, bf16, align 128), each of the three decode
launches (the shrink ``x·U_gu``, the gated expand with the down shrink fused, the down expand) runs
with the current tiles and with each variant below, as CUDA-graph replays over weight copies that
overflow L2; every time is set against the launch's own HBM floor, and the vendor GEMM's time at the
same shapes is beside the two plain matmuls. Each result is appended to ``--jsonl`` as it is measured.

    python benchmarks/decode_tiles.py --jsonl OUT/tiles.jsonl          # on a CUDA device
    python benchmarks/decode_tiles.py --chain                          # the whole op: PDL off, on, on + L2 prefetch
    TRITON_INTERPRET=1 python benchmarks/decode_tiles.py --dry-run     # the plumbing, on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import time
from unittest import mock

import torch
import torch.nn.functional as F

from svdmlp.bench.ceilings import measure_ceilings
from svdmlp.bench.environment import cache_bytes
from svdmlp.bench.workloads import random_lowrank, weight_sets
from svdmlp.cuda_graphs import capture_graph
from svdmlp.kernels import configs
from svdmlp.kernels.configs import GatedExpandTiles, MatmulTiles
from svdmlp.kernels.gated_expand import gated_expand
from svdmlp.kernels.matmul import matmul
from svdmlp.plan.planner import mlp_ranks
from svdmlp.plan.shapes import BUILTIN, MLPShape
from svdmlp.timing import cuda_median

# (block_n, block_k, stages, warps) of the weight-streaming matmul; block_m is 16 (one M tile).
MATMUL_VARIANTS = [
    (16, 128, 4, 4),
    (16, 256, 4, 4),
    (16, 256, 6, 4),
    (32, 64, 8, 4),
    (32, 128, 4, 4),
    (32, 128, 6, 4),
    (32, 256, 3, 4),
    (64, 64, 6, 4),
    (64, 128, 3, 4),
    (64, 128, 4, 8),
]
# (block_n, block_r, block_rd, stages, down_stages, warps) of the decode gated expand.
EXPAND_VARIANTS = [
    (32, 64, 64, 4, 6, 4),
    (32, 128, 64, 2, 9, 4),
    (32, 128, 128, 3, 4, 4),
    (64, 64, 32, 3, 9, 4),
    (64, 64, 64, 4, 6, 8),
    (64, 128, 32, 2, 9, 8),
    (64, 128, 64, 3, 6, 8),
    (128, 64, 32, 2, 8, 8),
    (128, 64, 64, 3, 4, 8),
    (16, 128, 128, 4, 6, 4),
]
# The chain's settings: programmatic dependent launch off and on, and on with each dependent launch
# asking L2 for a share of its weight rows before it waits (SVDMLP_PREFETCH).
CHAIN_SETTINGS = {
    "pdl0": {"SVDMLP_PDL": "0", "SVDMLP_PREFETCH": "0"},
    "pdl1": {"SVDMLP_PDL": "1", "SVDMLP_PREFETCH": "0"},
    "pdl1-prefetch0.25": {"SVDMLP_PDL": "1", "SVDMLP_PREFETCH": "0.25"},
    "pdl1-prefetch0.5": {"SVDMLP_PDL": "1", "SVDMLP_PREFETCH": "0.5"},
    "pdl1-prefetch1": {"SVDMLP_PDL": "1", "SVDMLP_PREFETCH": "1"},
}
DRY_SHAPE = MLPShape("tiny", 96, 200, 1, "llama")
DRY_MATMUL = [(16, 64, 2, 4)]
DRY_EXPAND = [(32, 32, 32, 2, 2, 4)]


@contextlib.contextmanager
def forced(matmul_tiles: MatmulTiles | None = None, expand_tiles: GatedExpandTiles | None = None):
    """Every launch inside picks ``matmul_tiles`` / ``expand_tiles`` (None: the planner's own)."""
    with contextlib.ExitStack() as stack:
        if matmul_tiles is not None:
            stack.enter_context(mock.patch.object(configs, "matmul_tiles", lambda *a, **k: matmul_tiles))
        if expand_tiles is not None:
            stack.enter_context(
                mock.patch.object(configs, "gated_expand_tiles", lambda *a, **k: expand_tiles)
            )
        yield


def seconds(fn, cuda: bool, repeats: int) -> float:
    """Median seconds of ``fn``: graph replays on CUDA, wall time of one call on a CPU."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return cuda_median(capture_graph(fn), repeats)


def launches(m, sets, dtype, device):
    """The three decode launches over every weight set, each as a zero-argument call, with the bytes
    it must move (weights, activations in and out) and, for plain matmuls, its vendor-GEMM twin."""
    hidden, r2 = sets[0].gate_up_u_t.shape
    r_down = sets[0].down_u_t.shape[1]
    x = torch.randn(m, hidden, device=device, dtype=dtype)
    strip = torch.randn(m, r2, device=device, dtype=dtype)
    down_strip = torch.zeros(m, r_down, device=device, dtype=torch.float32)
    out = torch.empty(m, hidden, device=device, dtype=dtype)
    size = dtype.itemsize

    def over_sets(step):
        return lambda: [step(w) for w in sets]

    def checked(step, result, expected):
        """Run ``step`` on the first weight set from fresh buffers; its error relative to float32."""

        def check() -> float:
            step(sets[0])
            want = expected(sets[0]).float()
            return ((result().float() - want).norm() / want.norm().clamp_min(1e-30)).item()

        return check

    w0 = sets[0]
    g = w0.gate_v_t.shape[0]

    def gated(w):
        return F.silu(strip[:, :g].float() @ w.gate_v_t.float()) * (strip[:, g:].float() @ w.up_v_t.float())

    shrink_bytes = sets[0].gate_up_u_t.nbytes + (x.numel() + strip.numel()) * size
    expand_bytes = sets[0].gate_v_t.nbytes + sets[0].up_v_t.nbytes + sets[0].down_u_t.nbytes
    down_bytes = sets[0].down_v_t.nbytes + down_strip.nbytes + out.numel() * size
    shrink = lambda w: matmul(x, w.gate_up_u_t, strip, zero=down_strip)  # noqa: E731

    def expand(w):
        gated_expand(strip, w.gate_v_t, w.up_v_t, "silu", down_u_t=w.down_u_t, down_strip=down_strip)

    down = lambda w: matmul(down_strip, w.down_v_t, out)  # noqa: E731
    return {
        "shrink": (
            over_sets(shrink),
            over_sets(lambda w: torch.mm(x, w.gate_up_u_t, out=strip)),
            shrink_bytes,
            checked(shrink, lambda: strip, lambda w: x.float() @ w.gate_up_u_t.float()),
        ),
        "gated_expand+down": (
            over_sets(expand),
            None,
            expand_bytes,
            checked(
                lambda w: (down_strip.zero_(), expand(w)),
                lambda: down_strip,
                lambda w: gated(w).to(dtype).float() @ w.down_u_t.float(),
            ),
        ),
        "down_expand": (
            over_sets(down),
            over_sets(lambda w: torch.mm(down_strip.to(dtype), w.down_v_t, out=out)),
            down_bytes,
            checked(down, lambda: out, lambda w: down_strip @ w.down_v_t.float()),
        ),
    }


def chain(shape, sets, m, dtype, device, bandwidth, repeats, cuda) -> dict:
    """The whole fused decode op under each of :data:`CHAIN_SETTINGS`, each checked against float64
    and timed as graph replays, against the factors' HBM floor."""
    from svdmlp.backends import torch_ref
    from svdmlp.bench.workloads import compare
    from svdmlp.kernels import lowrank_gated_mlp

    x = torch.randn(m, shape.hidden, device=device, dtype=dtype)
    reference = torch_ref.lowrank_gated_mlp(x.double(), *(f.double() for f in sets[0].factors), "silu")
    floor_us = sets[0].nbytes / bandwidth * 1e6
    record = {"model": shape.name, "m": m, "launch": "chain", "floor_us": floor_us}
    for name, settings in CHAIN_SETTINGS.items():
        with mock.patch.dict(os.environ, settings):
            try:
                check = compare(lowrank_gated_mlp(x, *sets[0].factors, "silu"), reference.to(dtype))
                us = seconds(lambda: [lowrank_gated_mlp(x, *w.factors, "silu") for w in sets], cuda, repeats)
                record[name] = {"us": us / len(sets) * 1e6, "check": check}
            except Exception as err:  # a failure with PDL on is the finding this section looks for
                record[name] = {"error": f"{type(err).__name__}: {err}"[:300]}
    print(
        f"{shape.name} M={m} chain: floor {floor_us:.1f} µs; "
        + "; ".join(
            f"{name}: "
            + (_percent(r["us"], floor_us) + f", check {r['check']['ok']}" if "us" in r else r["error"])
            for name, r in ((n, record[n]) for n in CHAIN_SETTINGS)
        ),
        flush=True,
    )
    return record


def emit(sink, record: dict) -> None:
    """Append ``record`` to the JSONL sink (if any) at once, so that a cut run keeps it."""
    if sink:
        sink.write(json.dumps(record) + "\n")
        sink.flush()


def _percent(us: float | None, floor_us: float) -> str:
    return f"{us:.1f} µs ({floor_us / us:.0%} of floor)" if us else "failed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b,qwen3-4b")
    parser.add_argument("--tokens", default="1,16")
    parser.add_argument("--keep", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--jsonl", default=None)
    parser.add_argument(
        "--chain",
        action="store_true",
        help="only the whole decode op, programmatic dependent launch off and on",
    )
    parser.add_argument("--dry-run", action="store_true", help="a tiny shape on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()

    cuda = not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    matmul_variants = [
        MatmulTiles(16, n, k, 1, w, s) for n, k, s, w in (MATMUL_VARIANTS if cuda else DRY_MATMUL)
    ]
    expand_variants = [
        GatedExpandTiles(16, n, r, rd, 1, w, s, ds)
        for n, r, rd, s, ds, w in (EXPAND_VARIANTS if cuda else DRY_EXPAND)
    ]
    bandwidth = measure_ceilings(device, dtype, 1 << 30, 4096).bandwidth if cuda else 1e10
    sink = open(args.jsonl, "a") if args.jsonl else None  # noqa: SIM115 (appended to as rows come)
    models = [BUILTIN[name] for name in args.models.split(",")] if cuda else [DRY_SHAPE]
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    for shape in models:
        ranks = mlp_ranks(shape, args.keep, 128 if cuda else 16).as_tuple()
        make = functools.partial(random_lowrank, shape.hidden, shape.intermediate, ranks, dtype, device)
        sets = weight_sets(make, cache_bytes(device)) if cuda else [make()]
        for m in (int(t) for t in args.tokens.split(",")):
            if args.chain:
                emit(sink, chain(shape, sets, m, dtype, device, bandwidth, args.repeats, cuda))
                continue
            for name, (planned, vendor, nbytes, check) in launches(m, sets, dtype, device).items():
                floor = nbytes / bandwidth
                variants = [None] + (expand_variants if name.startswith("gated") else matmul_variants)
                results = []
                for tiles in variants:
                    force = (
                        forced(expand_tiles=tiles) if name.startswith("gated") else forced(matmul_tiles=tiles)
                    )
                    try:
                        with force:
                            t = seconds(planned, cuda, args.repeats) / len(sets)
                            rel_err = check()
                    except Exception as err:  # a variant that does not compile or fit is a result too
                        t, rel_err = None, None
                        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
                    else:
                        error = None if rel_err < 2e-2 else f"wrong: relative error {rel_err:.2e}"
                        t = t if error is None else None
                    results.append(
                        {
                            "tiles": "planned" if tiles is None else tiles.__dict__,
                            "us": t and t * 1e6,
                            "rel_err": rel_err,
                            "error": error,
                        }
                    )
                vendor_us = (
                    seconds(vendor, cuda, args.repeats) / len(sets) * 1e6 if vendor is not None else None
                )
                timed = [r for r in results if r["us"] is not None]
                best = min(timed, key=lambda r: r["us"]) if timed else {"tiles": None, "us": None}
                record = {
                    "model": shape.name,
                    "m": m,
                    "launch": name,
                    "ranks": ranks,
                    "floor_us": floor * 1e6,
                    "planned_us": results[0]["us"],
                    "best": best,
                    "vendor_us": vendor_us,
                    "variants": results,
                }
                emit(sink, record)
                pct = functools.partial(_percent, floor_us=floor * 1e6)
                print(
                    f"{shape.name} M={m} {name}: floor {floor * 1e6:.1f} µs; planned {pct(results[0]['us'])}; "
                    f"best {pct(best['us'])} with {best['tiles']}"
                    + (f"; vendor {pct(vendor_us)}" if vendor_us else ""),
                    flush=True,
                )
                if not cuda:
                    continue
                print("    " + "  ".join(f"{r['us']:.1f}" if r["us"] else "x" for r in results), flush=True)
                for r in results:
                    if r["error"]:
                        print(f"    {r['tiles']}: {r['error']}", flush=True)
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
