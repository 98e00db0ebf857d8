"""Do two revisions of gemmgen pick the same kernels? The dry-run pick and its rendered CUDA, shape by shape.

For each revision (default: 324db45, the last commit before the architecture refactor of issue 18, and HEAD) a
temporary `git worktree` is made and a child Python process runs, with PYTHONPATH set to that tree, the same
function `gemmgen tune M N K --gpu GPU --dry-run` calls: rank the feasible space by the model, compile its top-k
with NVRTC, take the best-ranked one that compiled. For every shape of the public suite and every dtype it prints
the pick before and after, whether the pick's rendered CUDA source is byte-identical (and its cubin, when both
compiled), and for a difference a short summary of the source diff.

    python3 benchmarks/compare_picks.py                       # 324db45 against HEAD, bf16 and f16, --gpu h100
    python3 benchmarks/compare_picks.py --before A --after B --dtypes bf16 --no-compile --json /tmp/picks.json

CPU only: NVRTC compiles, nothing is launched. Compiles are served from the content-addressed NVRTC cache
(keyed by source and options, so sharing it between revisions is safe). `--no-compile` ranks and renders only
(the pick is then the model's first choice, as if it compiled).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "324db45"  # "perf-notes: what was not re-run after the operand swap", the last commit before the refactor

# Runs inside each revision's tree. The refactor moved the modules (gemmgen/search.py -> gemmgen/tune/search/,
# gemmgen/render.py -> gemmgen/codegen/render.py, ...), so the child finds dry_run, its engines and render under
# either layout; what it calls is the same public path the CLI's --dry-run takes at that revision.
CHILD = r'''
import hashlib, json, sys
from pathlib import Path
args = json.loads(sys.argv[1])
tree = Path(args["tree"]).resolve()
import gemmgen
assert Path(gemmgen.__file__).resolve().is_relative_to(tree), f"imported {gemmgen.__file__}, not from {tree}"
from gemmgen import Problem, lookup_gpu
try:                                   # after the refactor
    from gemmgen.tune.search import dry_run
    from gemmgen.tune.engines import InlineCompiler, default_engines
    from gemmgen.codegen.render import render
    from gemmgen.codegen.sass import dump_sass
except ImportError:                    # before it: one flat package
    from gemmgen.search import dry_run
    from gemmgen.engines import InlineCompiler, default_engines
    from gemmgen.render import render
    from gemmgen.sass import dump_sass


def sass_sha(cubin):
    """The SASS listing's hash with cuobjdump's header (file name, ELF details) left out: the machine code."""
    try:
        text = dump_sass(cubin)
    except Exception as exc:  # no cuobjdump here: say so in the row rather than fail the comparison
        return f"unavailable: {type(exc).__name__}"
    body = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith(("Fatbin", "====", "arch", "code for", "host", "compile_size", "identifier"))]
    return hashlib.sha256("\n".join(body).encode()).hexdigest()

gpu = lookup_gpu(args["gpu"])
sources = Path(args["sources"])
sources.mkdir(parents=True, exist_ok=True)
engines = default_engines(0 if args["no_compile"] else args["jobs"])
if args["no_compile"]:
    engines.compiler = InlineCompiler(task=render)  # "compiled" = the rendered source: rank and render only
rows = []
try:
    for shape in args["shapes"]:
        for dtype in args["dtypes"]:
            problem = Problem.create(shape["M"], shape["N"], shape["K"], dtype)
            result = dry_run(problem, gpu, top_k=args["top_k"], engines=engines)
            row = {"shape": shape["name"], "dtype": dtype, "label": problem.label, "space": result.space_size,
                   "top": [c.ranked.config.tag for c in result.candidates],
                   "failed": [c.ranked.config.tag for c in result.candidates if not c.ok],
                   "pick": None}
            if result.pick is not None:
                kernel = result.pick.kernel
                source = render(kernel)
                path = sources / f"{shape['name']}-{dtype}.cu"
                path.write_text(source)
                cubin = getattr(result.pick.compiled, "cubin", None)
                row["pick"] = {"name": kernel.name, "tag": kernel.config.tag, "rank": result.pick.ranked.rank,
                               "tflops": round(result.pick.ranked.tflops, 2), "source": str(path),
                               "source_sha": hashlib.sha256(source.encode()).hexdigest(),
                               "cubin_sha": hashlib.sha256(cubin).hexdigest() if cubin else None,
                               "sass_sha": sass_sha(cubin) if cubin else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
finally:
    engines.close()
'''


def load_shapes(path: Path) -> "list[dict]":
    import yaml

    data = yaml.safe_load(path.read_text())
    return [{"name": s["name"], "M": int(s["M"]), "N": int(s["N"]), "K": int(s["K"])} for s in data["shapes"]]


def git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *argv], check=True, capture_output=True, text=True).stdout.strip()


def picks_at(rev: str, work: Path, shapes, opts) -> "tuple[str, list[dict]]":
    """The dry-run rows of revision `rev`, computed in a temporary worktree of it."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = work / f"tree-{commit[:10]}"
    git("worktree", "add", "--detach", str(tree), commit)
    try:
        payload = {"tree": str(tree), "gpu": opts.gpu, "dtypes": opts.dtypes, "shapes": shapes,
                   "top_k": opts.top_k, "jobs": opts.jobs, "no_compile": opts.no_compile,
                   "sources": str(work / f"src-{commit[:10]}")}
        # The tree first on the path, and its own data directories: nothing of this checkout leaks in.
        env = dict(os.environ, PYTHONPATH=str(tree), GEMMGEN_DATA=str(work / f"data-{commit[:10]}"),
                   GEMMGEN_RESULTS=str(work / f"results-{commit[:10]}"))
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(payload)], cwd=tree, env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"compare_picks: the dry run at {rev} ({commit[:10]}) failed:\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        # The sources must outlive the worktree: they sit in work/src-*, not in the tree.
        return commit, rows
    finally:
        git("worktree", "remove", "--force", str(tree))


def code_lines(path: str) -> "list[str]":
    """The source without // comments, blank lines and indentation: what the compiler reads, roughly."""
    out = []
    for line in Path(path).read_text().splitlines():
        code = line.split("//", 1)[0].strip()
        if code:
            out.append(" ".join(code.split()))
    return out


def diff_summary(before_path: str, after_path: str, limit: int = 6) -> "list[str]":
    """How two rendered sources differ: line counts, then whether the code (comments and blank lines left out)
    differs, and its first changed lines."""
    a = Path(before_path).read_text().splitlines()
    b = Path(after_path).read_text().splitlines()
    raw = sum(1 for line in difflib.unified_diff(a, b, lineterm="", n=0)
              if line[:1] in "+-" and not line.startswith(("+++", "---")))
    ca, cb = code_lines(before_path), code_lines(after_path)
    if ca == cb:
        return [f"{len(a)} -> {len(b)} lines, {raw} changed; without comments and blank lines: the same code"]
    if sorted(ca) == sorted(cb):
        return [f"{len(a)} -> {len(b)} lines, {raw} changed; without comments and blank lines: the same code "
                f"lines, reordered"]
    changed = [line for line in difflib.unified_diff(ca, cb, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    only_a, only_b = sorted(set(ca) - set(cb)), sorted(set(cb) - set(ca))
    head = [f"{len(a)} -> {len(b)} lines, {raw} changed; without comments and blank lines {len(changed)} changed "
            f"lines ({len(only_a)} distinct only before, {len(only_b)} only after):"]
    return head + [f"    - {line[:140]}" for line in only_a[:limit]] + [f"    + {line[:140]}" for line in only_b[:limit]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help=f"git revision (default {BEFORE})")
    parser.add_argument("--after", default="HEAD", help="git revision (default HEAD)")
    default_shapes = ROOT / "results" / "shapes.yaml"
    if not default_shapes.is_file():
        default_shapes = Path("/work/shared/shapes.yaml")
    parser.add_argument("--shapes", type=Path, default=default_shapes, help="suite YAML (default results/shapes.yaml)")
    parser.add_argument("--dtypes", default="bf16,f16")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--top-k", type=int, default=10, help="as `gemmgen tune --dry-run`'s default")
    parser.add_argument("--jobs", type=int, default=2, help="NVRTC processes")
    parser.add_argument("--no-compile", action="store_true", help="rank and render only")
    parser.add_argument("--json", type=Path, help="write every row of both revisions here")
    opts = parser.parse_args()
    opts.dtypes = [d.strip() for d in opts.dtypes.split(",") if d.strip()]
    shapes = load_shapes(opts.shapes)

    with tempfile.TemporaryDirectory(prefix="compare-picks-") as tmp:
        work = Path(tmp)
        commit_a, rows_a = picks_at(opts.before, work, shapes, opts)
        commit_b, rows_b = picks_at(opts.after, work, shapes, opts)
        print(f"before {opts.before} = {commit_a[:10]}, after {opts.after} = {commit_b[:10]}; --gpu {opts.gpu}, "
              f"top-k {opts.top_k}, {'rank and render only' if opts.no_compile else 'compiled with NVRTC'}")
        print(f"{'shape':<12} {'dtype':<5} {'space':>9}  {'same pick':<9} {'same top':<8} {'source':<9} {'cubin':<9}  pick (after)")
        print(f"{'':<12} {'':<5} {'(before/after)':>14}")
        details, same_all = [], True
        for a, b in zip(rows_a, rows_b):
            pa, pb = a["pick"], b["pick"]
            same_pick = (pa and pb and pa["name"] == pb["name"]) or (pa is None and pb is None)
            same_src = bool(pa and pb and pa["source_sha"] == pb["source_sha"])
            if pa and pb and pa["cubin_sha"] and pb["cubin_sha"]:
                cubin = ("identical" if pa["cubin_sha"] == pb["cubin_sha"] else
                         "same SASS" if pa["sass_sha"] == pb["sass_sha"] and "unavailable" not in pa["sass_sha"] else
                         "differs")
            else:
                cubin = "-"
            same_all &= bool(same_pick and same_src)
            print(f"{a['shape']:<12} {a['dtype']:<5} {a['space']:>4}/{b['space']:<4}  {'yes' if same_pick else 'NO':<9} "
                  f"{'yes' if a['top'] == b['top'] else 'NO':<8} {'identical' if same_src else 'differs':<9} {cubin:<9}  {pb['tag'] if pb else '(none)'}")
            if not same_pick or a["top"] != b["top"]:
                details.append(f"{a['shape']} {a['dtype']}: pick before {pa['tag'] if pa else None} "
                               f"(rank {pa['rank'] + 1 if pa else '-'}), after {pb['tag'] if pb else None}")
                details.append(f"    top before: {a['top'][:4]}")
                details.append(f"    top after:  {b['top'][:4]}")
            if pa and pb and not same_src:
                details.append(f"{a['shape']} {a['dtype']}: source of the pick (before vs after): "
                               + "\n".join(diff_summary(pa["source"], pb["source"])))
        if details:
            print("\ndifferences:")
            print("\n".join(details))
        print(f"\n{'every pick and its source identical' if same_all else 'some picks or sources differ'} "
              f"({len(rows_a)} cases)")
        if opts.json:
            opts.json.write_text(json.dumps({"before": commit_a, "after": commit_b, "gpu": opts.gpu,
                                             "rows_before": rows_a, "rows_after": rows_b}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
