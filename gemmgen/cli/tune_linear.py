"""`gemmgen tune-linear IN OUT`: tune a Linear layer's forward, data-grad and weight-grad products for
gemmgen.nn.Linear; `--dry-run --gpu NAME` exports the model's picks without a GPU."""
from __future__ import annotations

import sys

from ..model.arch import lookup_gpu
from ..model.errors import InvalidInput
from ..model.linear import ACTIVATIONS, LinearLayer
from ..tune.buckets import MAX_M
from ._common import (COUNT_MAX, SECONDS_MAX, add_gpu_arg, check_cache, check_named, float_arg, int_arg,
                      refuse_together, table, text_arg)
from .tune import (MEASURING_FLAGS, Progress, add_search_args, check_dry_run, measurer_for, options_from_args,
                   sigterm_as_interrupt)


def register(subparsers) -> None:
    p = subparsers.add_parser("tune-linear", help="tune the products of a Linear layer for gemmgen.nn.Linear",
                              description="Tune Y = act(X·Wᵀ + b) (M = tokens, N = OUT, K = IN), the data gradient "
                                          "dX = dY·W (M = tokens, N = IN, K = OUT) and the weight gradient dW = "
                                          "dYᵀ·X (M = OUT, N = IN, K = tokens) at the top of the token range (for a "
                                          "GELU or SiLU layer also the training forward X·Wᵀ + b, whose output "
                                          "autograd keeps for the activation's backward), and "
                                          "store each winner in the per-user kernel store (<data dir>/kernels/"
                                          "<gpu>/), where gemmgen.nn.Linear and gemmgen.mm find them.")
    p.add_argument("IN", type=text_arg("IN"), help="in_features (K of the forward)")
    p.add_argument("OUT", type=text_arg("OUT"), help="out_features (N of the forward)")
    p.add_argument("--tokens", default="1..8192", metavar="LO..HI", type=text_arg("--tokens"),
                   help="token counts the layer serves, or one count (default 1..8192)")
    p.add_argument("--buckets", default="pow2", metavar="RULE", type=text_arg("--buckets"),
                   help="the forward and data-grad products (M = tokens) over a range: pow2 (default: a dispatch "
                        "table of power-of-two token buckets), auto (buckets merged where one kernel serves two "
                        "within 1%%), none (one kernel, tuned at HI); the weight gradient is tuned at HI")
    p.add_argument("--dtype", default="bf16", type=text_arg("--dtype"), help="bf16 (default) or f16")
    p.add_argument("--bias", action="store_true", help="the layer has a bias")
    p.add_argument("--bias-grad", default=None, type=text_arg("--bias-grad"),
                   help="with --bias: fused (default: the weight-gradient kernel also writes the bias gradient, "
                        "where a family can) or separate (a reduction on torch)")
    p.add_argument("--activation", default="none", type=text_arg("--activation"),
                   help=f"{', '.join(ACTIVATIONS)} (default none; gelu is the tanh "
                                                        "approximation)")
    add_gpu_arg(p)
    p.add_argument("--dry-run", action="store_true", help="no GPU: rank by the model, compile the top-k, store the "
                                                          "model's picks unmeasured (needs --gpu)")
    p.add_argument("--trials", type=int_arg("--trials", 1, COUNT_MAX), default=60,
                   help="measured trials per product (default 60)")
    p.add_argument("--timeout", type=float_arg("--timeout", 0, SECONDS_MAX, lo_open=True), default=None, metavar="S",
                   help="stop each product's search after S s")
    p.add_argument("--patience", type=int_arg("--patience", 1, COUNT_MAX), default=30,
                   help="trials without a 0.5%% gain before a product stops "
                                                           "(default 30)")
    p.add_argument("--storage", default=None, metavar="URL", type=text_arg("--storage"),
                   help="Optuna storage (default: the per-user one)")
    add_search_args(p, top_k=8)
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.set_defaults(func=run, replay=None, out=None)


def run(args) -> int:
    from ..tune.linear import tune_linear

    from ..tune.buckets import BUCKETINGS

    refuse_together(args, "--dry-run", MEASURING_FLAGS, "a dry run measures nothing")
    if args.bias_grad is not None and not args.bias:
        raise InvalidInput("--bias-grad needs --bias (a layer without a bias has no bias gradient)", args.bias_grad)
    layer = LinearLayer.create(args.IN, args.OUT, args.dtype, args.bias, str(args.activation).lower(), args.tokens,
                               str(args.bias_grad or "fused").lower())
    if args.buckets not in BUCKETINGS + ("none",):
        raise InvalidInput(f"--buckets must be one of {', '.join(BUCKETINGS + ('none',))}", args.buckets)
    bucketing = None if args.buckets == "none" else args.buckets
    if bucketing and layer.tokens_max > MAX_M:  # the forward and data grad are bucketed over tokens as --m is
        raise InvalidInput(f"--tokens must stay at most {MAX_M} (the token range is bucketed as tune --m is)",
                           args.tokens)
    check_dry_run(args)
    options = options_from_args(args)
    check_cache()
    if args.dry_run:
        gpu = lookup_gpu(args.gpu)
        check_products(layer, gpu)
        check_store(gpu)
        products = tune_linear(layer, gpu, dry_run=True, top_k=options.top_k, jobs=options.jobs,
                               bucketing=bucketing)
    else:
        gpu, measurer, device = measurer_for(args, args.gpu)
        try:
            check_products(layer, gpu)
            check_store(gpu)
        except InvalidInput:
            measurer.close()
            raise
        progress = Progress(not args.no_progress)
        try:
            with sigterm_as_interrupt():
                products = tune_linear(layer, gpu, dry_run=False, measurer=measurer, options=options,
                                       device=device, on_event=progress, bucketing=bucketing)
        finally:
            progress.close()
            measurer.close()
    print_products(layer, products, args.dry_run)
    return 0 if all(p.kernel for p in products) else 1


def check_products(layer: LinearLayer, gpu) -> None:
    """Each product at the top of the token range checked as `tune M N K` checks a problem, naming the product: a
    dimension no family can index is refused now, not after every bucket's search came back empty. The epilogue
    is left out: where no family writes the bias gradient, tune_linear falls back to torch for it."""
    from dataclasses import replace

    from ..model.problem import Epilogue

    for role, problem in layer.problems().items():
        check_named(replace(problem, epilogue=Epilogue()), gpu,
                    f"the {role} product {problem.m}x{problem.n}x{problem.k}")


def check_store(gpu) -> None:
    """InvalidInput naming the kernel store (and GEMMGEN_DATA when set) when its GPU folder cannot be written:
    checked before any product is ranked or tuned, not at the first export, which named a staging folder and an
    --out flag this command does not have."""
    import os

    from ..model import paths
    from ..model.files import writable_dir

    rule = ("GEMMGEN_DATA must name a folder whose kernels/<gpu>/ gemmgen can create and write (the kernel store)"
            if os.environ.get("GEMMGEN_DATA") else
            "the kernel store must be a folder gemmgen can create and write (set GEMMGEN_DATA to move it)")
    writable_dir(rule, paths.kernels_dir() / gpu.key)


def print_products(layer: LinearLayer, products, dry_run: bool) -> None:
    what = "model's picks, not measured" if dry_run else "measured winners"
    print(f"Linear {layer.in_features} -> {layer.out_features} ({layer.dtype.value}"
          f"{', bias' if layer.bias else ''}{', ' + layer.activation if layer.activation != 'none' else ''}), "
          f"tokens {layer.tokens_min}..{layer.tokens_max}: {what}")
    rows = []
    for p in products:
        speed = ""
        tables = getattr(p.result, "tables", None)
        if tables is not None:  # a dispatch folder: one kernel per token bucket
            buckets = [f"{e['m_min']}..{e['m_max']}" for t in tables for e in t["buckets"]]
            rows.append([p.role, f"Tx{p.problem.n}x{p.problem.k} {p.problem.a_layout.letter}"
                                 f"{p.problem.b_layout.letter}", "-",
                         f"dispatch: {len(p.result.kernels)} kernels over {len(buckets)} token buckets"
                         if p.kernel else "nothing exported"])
            continue
        winner = getattr(p.result, "winner", None)
        if winner is not None:
            speed = f"{winner.tflops:.1f}"
        elif getattr(p.result, "pick", None) is not None:
            speed = f"{p.result.pick.ranked.tflops:.1f} (model)"
        rows.append([p.role, f"{p.problem.m}x{p.problem.n}x{p.problem.k} "
                             f"{p.problem.a_layout.letter}{p.problem.b_layout.letter}",
                     speed or "-", p.kernel or "nothing exported"])
    print(table(rows, ["product", "MxNxK layouts", "TFLOP/s", "kernel"]))
    if products:
        print(f"stored under {products[0].folder.parent}")
    if any(not p.kernel for p in products):
        print("some products have no kernel: gemmgen.nn.Linear runs them on torch", file=sys.stderr)
