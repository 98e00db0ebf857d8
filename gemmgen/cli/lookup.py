"""`gemmgen lookup M N K`: the stored winner for a problem, or the nearest shape held, without tuning."""
from __future__ import annotations

from ._common import add_gpu_arg, add_problem_args, check_problem, print_json, problem_from_args, resolve_gpu


def register(subparsers) -> None:
    p = subparsers.add_parser("lookup", help="the tuned winner stored in results/ (or the nearest shape held)",
                              description="Answer from results/<gpu>/ without tuning: the exact problem if it was "
                                          "tuned, else the nearest shape held (log-distance over M, N, K; same "
                                          "dtype and layouts preferred), saying which.")
    add_problem_args(p)
    add_gpu_arg(p)
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.set_defaults(func=run)


def describe(answer, problem) -> "list[str]":
    """The lines lookup prints for one answer (shared with the suite's report)."""
    record, held = answer.record, answer.problem
    w = record["winner"]
    lines = []
    if answer.exact:
        lines.append(f"exact match: {held.label} on {record['gpu']}, tuned {record.get('date', '?')}")
    else:
        why = "" if answer.same_operands else (
            " (tuned for rows of another alignment: compile its configuration for this problem)"
            if answer.other_alignment else " (different dtype, layouts or epilogue: none with the same held)")
        lines.append(f"no record for {problem.label}; nearest held: {held.label} "
                     f"(log-distance {answer.distance:.2f}){why}, tuned {record.get('date', '?')}")
    if not answer.fits:
        lines.append(f"  note: no held winner fits this problem; this one breaks '{answer.misfit}': tune it")
    if record.get("simulated"):
        lines.append(f"  note: simulated tune (replayed timings from {record.get('replay')}), not a GPU measurement")
    lines.append(f"winner: {w['kernel']}")
    spread = ""
    if w.get("min_time_s") is not None:
        spread = f" (min {w['min_time_s'] * 1e3:.4f}, max {w['max_time_s'] * 1e3:.4f} ms, {w['rounds']} rounds)"
    lines.append(f"  median {w['median_time_s'] * 1e3:.4f} ms = {w['tflops']:.1f} TFLOP/s{spread}")
    cublas = record.get("cublas")
    if cublas and cublas.get("time_s"):
        lines.append(f"  cuBLAS {cublas['time_s'] * 1e3:.4f} ms = {cublas['tflops']:.1f} TFLOP/s; "
                     f"ratio {cublas['time_s'] / w['median_time_s']:.2f}x")
    if w.get("bundle"):
        lines.append(f"  bundle: {w['bundle']}")
    lines.append(f"  record: {answer.path}")
    return lines


def run(args) -> int:
    import yaml

    from ..tune.results import lookup

    problem = problem_from_args(args)
    gpu = resolve_gpu(args.gpu)
    # A problem tune refuses has no winner to answer with: the nearest stored shape would be a wrong answer.
    check_problem(problem, gpu)
    answer = lookup(problem, gpu)
    if args.json:
        print_json({"exact": answer.exact, "distance": answer.distance, "same_operands": answer.same_operands,
                    "fits": answer.fits, "misfit": answer.misfit,
                    "record_path": str(answer.path), "problem": answer.record["problem"],
                    "winner": answer.record["winner"], "cublas": answer.record.get("cublas"),
                    "simulated": answer.record.get("simulated", False)})
        return 0
    print("\n".join(describe(answer, problem)))
    print("config:")
    print("  " + yaml.safe_dump(answer.record["winner"]["config"], sort_keys=False).rstrip().replace("\n", "\n  "))
    return 0
