"""The sm90_wgmma family: template parameters, TMA tensor-map specs and launch manifests.

The kernel (templates/sm90_wgmma/kernel.cu.j2) is warp-specialized: one producer warpgroup issues TMA into a
ring of `stages` 128B-swizzled stages, and one or two consumer warpgroups run wgmma m64nNk16 on them.
A operand tiles are BM x 64 and B tiles BN x 64 per stage, each as 64-wide blocks of 8 KB; a cluster of
2 CTAs shares (multicasts) B when it is 2x1 and A when it is 1x2.

Pure Python: no cuda-python import here (tma.py encodes the maps on the device side).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ...model.arch import Arch, lookup_gpu
from ...model.problem import Layout, Operands, Problem
from ...model.tiles import DecompKind, Kernel, streamk_remainder
from ..base import Launches
from .rules import SPLIT_FACTOR, a_is_kmajor, b_is_kmajor, epi_boxes, mn_blocks, smem_bytes

REDUCE_THREADS = 256  # split-K reduction block, as the sm80 family's (render.REDUCE_THREADS)
TMA_BOX_ROWS = 256      # the most rows (elements of any dimension) one TMA box spans
SWIZZLE_ROW_BYTES = 128  # one 128B-swizzle row: the TMA box's inner extent (64 16-bit or 128 fp8 elements)
# The tensor maps' L2 promotion, recorded in each manifest spec ("l2_promotion") so every launcher encodes
# the same map. 128B, not 256B: over rows that do not start on 128-byte boundaries (ld 3000 bf16) 256B ran
# 3000^3 13-16% slower; aligned rows (3008, 4096^3) showed no difference (docs/perf-notes.md, odd3000).
L2_PROMOTION = "128B"
# The TMA-store epilogue's box per consumer warp: 16 rows x 32 columns, 64B swizzle (templates/sm90_wgmma/
# epilogue.cuh.j2, EPI_COLS). 16 x 64 boxes (128B swizzle, half the TMA stores) measured a tie on four suite
# winners (docs/perf-notes.md). D leaves through TMA stores where its rows allow (uses_tma_store): against the
# vectorized st.global epilogue a tie on six suite winners, kept because the consumers issue a quarter of the
# instructions and never wait on D's writes.
EPI_BOX_COLS, EPI_BOX_ROWS = 32, 16


def gemm_problem(kernel: Kernel, problem: Problem) -> Problem:
    """The product the kernel's main loop computes: `problem`, or for a swapped kernel D^T = B^T @ A^T (its
    M, N, K, lda and ldb are what the kernel's scalars and A/B tensor maps take; ldc and D stay `problem`'s)."""
    return problem.swapped() if kernel.config.swap_ab else problem


def gemm_operands(kernel: Kernel) -> Operands:
    """The operands as the kernel's main loop sees them (swapped for a swapped kernel)."""
    return kernel.operands.swapped() if kernel.config.swap_ab else kernel.operands


# --- packing operands TMA cannot read ---------------------------------------------------------------
# TMA needs every global stride to be a multiple of 16 bytes. An operand whose rows are not (ld 4095 bf16) is
# first copied by <name>_pack (one launch for both operands) into the workspace with its leading dimension rounded up to 128 bytes (rows that
# start off 128-byte boundaries slow TMA 1.3-1.5x, docs/perf-notes.md, odd3000); the main loop's tensor map then
# reads the copy. Only the leading dimension changes: the copy's extent stays M x K (K x N), TMA fills the rest
# of each box with zeros, so nothing past the extent is written or read.
PACK_THREADS = 256
PACK_CHUNK = 8             # elements one thread copies per step: one 16-byte store of 16-bit elements
PACK_ROWS = 4              # rows one thread copies per step, loads before stores (more bytes in flight)
PACK_ROW_BYTES = 128       # leading dimension of a packed copy: a multiple of this many bytes
PACK_MAX_GRID_Y = 65535    # rows beyond this are walked by the y grid-stride loop
# 3xTF32: the main loop runs three K segments, big·big + big·small + small·big. big is the fp32 operand itself
# (wgmma reads the top 19 bits: the value truncated to tf32) and small = tf32(x - trunc(x)) a copy the pre-pass
# writes; A's segments read [big, big, small] and B's [big, small, big] through two tensor maps per operand.
# (SPLIT_FACTOR, the number of segments, lives in rules.py: the K scalar it multiplies must fit an int.)


# fp8 and tf32: wgmma reads these operands K-major only (its transpose bits are for 16-bit types), so an operand
# whose storage keeps M (N) contiguous is transposed by the pack launch into a K-major copy, and an fp8 or tf32
# operand whose rows TMA cannot read is copied the same way; the main loop is the K-major one either way. The
# copy goes through a shared-memory tile of 128 bytes of columns by 128 rows (TRANSPOSE_TILE_BYTES, _ROWS):
# 16-byte reads along the source's rows, 16-byte writes along K (templates/sm90_wgmma/pack.cuh.j2, tile_pack).
TRANSPOSE_TILE_BYTES = 128
TRANSPOSE_TILE_ROWS = 128   # source rows per tile: four 16-byte loads per thread in flight (fp32 too)


def transposed(kernel: Kernel) -> "tuple[bool, bool]":
    """(A, B) of the main loop that the pack launch transposes into K-major copies: fp8 and tf32 operands stored
    MN-major (A column-major, B row-major; swapped, the caller's B row-major or A column-major)."""
    ops = gemm_operands(kernel)
    if ops.a_dtype.bytes == 2:   # wgmma transposes 16-bit operands itself (the descriptors' major-ness bits)
        return False, False
    return not a_is_kmajor(ops), not b_is_kmajor(ops)


def mainloop_operands(kernel: Kernel) -> Operands:
    """The operands as the main loop reads them from shared memory: gemm_operands with the transposed ones
    (transposed()) K-major, as their packed copies are."""
    ops = gemm_operands(kernel)
    t_a, t_b = transposed(kernel)
    return replace(ops, a_layout=Layout.ROW if t_a else ops.a_layout, b_layout=Layout.COL if t_b else ops.b_layout)


def tile_pack(kernel: Kernel) -> bool:
    """The pack launch is the shared-memory tile copy (fp8 and tf32: transposes, any alignment, 3xTF32's split
    on the way), not the 16-bit row copy or the K-major split pass that 3xTF32 on aligned K-major rows keeps."""
    ops = gemm_operands(kernel)
    if ops.a_dtype.bytes == 2:
        return False
    if kernel.config.split3:
        return any(transposed(kernel)) or any(_misaligned(ops))
    return any(packed(kernel))


def _misaligned(ops: Operands) -> "tuple[bool, bool]":
    """(A, B) whose rows do not start on 16-byte boundaries, which TMA cannot read."""
    a, b = ops.rows_aligned
    return not a, not b


def packed(kernel: Kernel) -> "tuple[bool, bool]":
    """(A packed, B packed): the main loop's operands whose rows TMA cannot read in place, and (fp8, tf32) those
    the pack launch transposes to K-major."""
    misaligned = _misaligned(gemm_operands(kernel))
    t_a, t_b = transposed(kernel)
    return misaligned[0] or t_a, misaligned[1] or t_b


def pack_plan(kernel: Kernel, problem: Problem) -> "list[dict]":
    """The pack copies of `problem`: per packed operand its name in the caller's frame, the rows and columns of
    its storage (row-major view: columns contiguous), its source and packed leading dimensions, whether the copy
    is transposed (its rows then are the storage's columns), and the byte offset of the copy in the workspace
    (after `base` bytes the kernel's other workspace uses)."""
    gp, ops = gemm_problem(kernel, problem), gemm_operands(kernel)
    pack_a, pack_b = packed(kernel)
    t_a, t_b = transposed(kernel)
    split = kernel.config.split3   # 3xTF32: both operands get a small part (rules: unswapped)
    # Aligned K-major fp32 rows are read in place as the big part; the tile pack copies them (transposed or
    # realigned) into a big plane beside the small one.
    big_in_place = split and not tile_pack(kernel)
    a_name, b_name = ("B", "A") if kernel.config.swap_ab else ("A", "B")
    plan = []
    # Storage of the main loop's A (M x K): K-major rows are M of K, MN-major rows are K of M; B likewise.
    if pack_a or split:
        rows, cols = (gp.m, gp.k) if a_is_kmajor(ops) else (gp.k, gp.m)
        plan.append({"operand": "A", "tensor": a_name, "rows": rows, "cols": cols, "ld": gp.lda,
                     "elt": ops.a_dtype.bytes, "transpose": t_a, "split3": split})
    if pack_b or split:
        rows, cols = (gp.n, gp.k) if b_is_kmajor(ops) else (gp.k, gp.n)
        plan.append({"operand": "B", "tensor": b_name, "rows": rows, "cols": cols, "ld": gp.ldb,
                     "elt": ops.b_dtype.bytes, "transpose": t_b, "split3": split})
    for p in plan:
        per_row = PACK_ROW_BYTES // p["elt"]
        out_rows, out_cols = (p["cols"], p["rows"]) if p["transpose"] else (p["rows"], p["cols"])
        p["out_rows"], p["out_cols"] = out_rows, out_cols
        p["packed_ld"] = -(-p["out_cols"] // per_row) * per_row
        p["plane_bytes"] = out_rows * p["packed_ld"] * p["elt"]
        # planes written: the copy; for 3xTF32 the small part too, or only it where big is read in place
        p["planes"] = (1 if big_in_place else 2) if split else 1
        p["big_in_place"] = big_in_place
        p["bytes"] = p["plane_bytes"] * p["planes"]
    return plan


def _place(plan: "list[dict]", base: int) -> int:
    """Give each copy its workspace offset from `base` (1024-byte aligned); the workspace's end."""
    offset = -(-base // 1024) * 1024
    for p in plan:
        p["offset"] = offset
        if p.get("split3"):   # the small part's plane: the whole copy, or right after the big plane (the pack
            # kernel writes it there; rows are 128-byte multiples, so the plane starts on a 128-byte boundary)
            p["small_offset"] = offset + (0 if p["big_in_place"] else p["plane_bytes"])
        offset += -(-p["bytes"] // 1024) * 1024
    return offset


def pack_launch(kernel: Kernel, plan: "list[dict]") -> dict:
    """The one launch of <name>_pack (or <name>_split3): copy z of `plan` (one or two operands) in blockIdx.z == z,
    every row of the operand's storage copied to its packed leading dimension (tile_pack: transposed where the
    copy says so, split for 3xTF32). With one copy, the second parameter set repeats the first (its blockIdx.z
    never runs)."""
    if tile_pack(kernel):
        return _tile_pack_launch(kernel, plan)
    params = []
    split = bool(plan[0].get("split3"))
    ctype = "float" if split else "u16"
    for z in range(2):
        copy = plan[min(z, len(plan) - 1)]
        params += _copy_params(z, copy, ctype)
    chunk = 16 // plan[0]["elt"]   # one 16-byte vector per thread and row
    chunks = max(-(-c["cols"] // chunk) for c in plan)
    row_groups = max(-(-c["rows"] // PACK_ROWS) for c in plan)
    return {"entry": f"{kernel.name}_{'split3' if split else 'pack'}",
            "grid": [-(-chunks // PACK_THREADS), min(row_groups, PACK_MAX_GRID_Y), len(plan)],
            "block": [PACK_THREADS, 1, 1], "cluster": [1, 1, 1], "dynamic_smem": 0, "params": params}


def _copy_params(z: int, copy: dict, ctype: str) -> "list[dict]":
    # The split pass of aligned rows writes only the small part; the tile pack writes planes from `offset` on.
    dst = copy["small_offset"] if copy.get("big_in_place") else copy["offset"]
    return [{"name": f"src{z}", "ctype": f"const {ctype}*", "kind": "tensor", "tensor": copy["tensor"]},
            {"name": f"dst{z}", "ctype": f"{ctype}*", "kind": "workspace", "offset_bytes": dst},
            {"name": f"rows{z}", "ctype": "int", "kind": "scalar", "value": copy["rows"]},
            {"name": f"cols{z}", "ctype": "int", "kind": "scalar", "value": copy["cols"]},
            {"name": f"ld_src{z}", "ctype": "int", "kind": "scalar", "value": copy["ld"]},
            {"name": f"ld_dst{z}", "ctype": "int", "kind": "scalar", "value": copy["packed_ld"]}]


def _tile_pack_launch(kernel: Kernel, plan: "list[dict]") -> dict:
    """<name>_pack for fp8 and tf32: one CTA per tile of the source's storage (TRANSPOSE_TILE_BYTES of columns by
    TRANSPOSE_TILE_ROWS rows), y walking the rows in a grid-stride loop. Per copy,
    `mode`: bit 0 transposes, bit 1 the 3xTF32 split (the copy, then the small part one plane further)."""
    params = []
    for z in range(2):
        copy = plan[min(z, len(plan) - 1)]
        split = 1 if copy["split3"] else 0
        params += _copy_params(z, copy, "unsigned char")
        params.append({"name": f"mode{z}", "ctype": "int", "kind": "scalar",
                       "value": int(copy["transpose"]) | split << 1})
    tile = TRANSPOSE_TILE_BYTES // plan[0]["elt"]   # elements along each side of the tile
    col_tiles = max(-(-c["cols"] // tile) for c in plan)
    row_tiles = max(-(-c["rows"] // TRANSPOSE_TILE_ROWS) for c in plan)
    return {"entry": f"{kernel.name}_pack", "grid": [col_tiles, min(row_tiles, PACK_MAX_GRID_Y), len(plan)],
            "block": [PACK_THREADS, 1, 1], "cluster": [1, 1, 1], "dynamic_smem": 0, "params": params}


def prepass_bytes(kernel: Kernel, problem: Problem) -> int:
    """DRAM bytes the pack launches move: each packed operand read once and its copy (transposed, or 3xTF32's
    small part, beside the copy where the operand is packed anyway) written once."""
    return sum((p["rows"] * p["cols"] + p["planes"] * p["out_rows"] * p["out_cols"]) * p["elt"]
               for p in pack_plan(kernel, problem))


def has_scales(kernel: Kernel) -> bool:
    """fp8 kernels take scales of A and B (float*, null meaning 1): the ABI's scale_a and scale_b after bias."""
    return kernel.operands.a_dtype.bytes == 1




def _box(tile_rows: int, kmajor: bool, split: int, elt: int) -> "tuple[list[int], str]":
    """An operand's TMA box (inner, outer) and swizzle. K-major: one 128-byte row of K by the operand's tile rows
    (or its slice of a multicast), 128B swizzle. MN-major: one main block of the tile's columns (64, or 32 / 16 for
    a tile narrower than 64 columns: rules.mn_blocks) by 64 rows of K."""
    if kmajor:
        rows = tile_rows // split
        # A box spans at most 256 rows: a wider tile (or slice) loads as two boxes (the template's *_BOX_ROWS).
        return [SWIZZLE_ROW_BYTES // elt, rows // 2 if rows > TMA_BOX_ROWS else rows], "128B"
    span = mn_blocks(tile_rows, elt)[1]
    return [span // elt, 64], f"{span}B"


def remainder_tensormap(kernel: Kernel, tm_b: dict) -> "list[dict]":
    """tmBr, where an MN-major B tile has remainder columns past its 64-column blocks (rules.mn_blocks): tmB's
    tensor in boxes of one remainder block (16 or 32 columns by 64 rows of K) under that block's swizzle."""
    ops = mainloop_operands(kernel)
    if b_is_kmajor(ops):
        return []
    _, _, rem, span = mn_blocks(kernel.config.cta.n, ops.b_dtype.bytes)
    if not rem:
        return []
    return [{**tm_b, "name": "tmBr", "box": [span // ops.b_dtype.bytes, 64], "swizzle": f"{span}B"}]


def uses_tma_store(kernel: Kernel) -> bool:
    """D leaves through TMA stores (a third tensor map) when its rows start on 16-byte boundaries (align_c 8,
    TMA's rule) and the kernel writes D itself: split-K's partials are fp32 plain stores and its D comes from
    the reduction. Otherwise the epilogue stages per warp and stores with vectorized st.global; so do swapped
    kernels (their tile is D^T's) and tiles whose N is not a multiple of 64."""
    cfg = kernel.config
    return kernel.operands.align_c >= 8 and splits(kernel) == 1 and not cfg.swap_ab and cfg.cta.n % 64 == 0


def uses_composed_stores(kernel: Kernel) -> bool:
    """D is 16-bit and its rows are not 16-byte aligned (no TMA store) in a kernel that writes D itself, and each
    consumer warp's share of a tile fits its store boxes at once: the consumers stage D in the boxes as for TMA
    stores, then write each row as aligned 16-byte stores composed from two staged 8-element groups (the few
    elements at the row's ends as 2-byte stores). Where the share does not fit, rows would leave in runs of 32-64
    columns, each with its own ends: measured slower than the element stores they replace (docs/perf-notes.md,
    "Composed stores"), so those kernels keep the staged element stores."""
    cfg = kernel.config
    share = (cfg.warp.m // 64) * (cfg.warp.n // 32)
    return (kernel.operands.align_c < 8 and kernel.operands.c_dtype.bytes == 2 and splits(kernel) == 1
            and not cfg.swap_ab and cfg.cta.n % 64 == 0 and epi_boxes(cfg, kernel.operands) >= share)


def uses_box_epilogue(kernel: Kernel) -> bool:
    """The consumers stage D in 16 x 32 boxes (stmatrix): for TMA stores or for the composed stores."""
    return uses_tma_store(kernel) or uses_composed_stores(kernel)


def uses_store_warp(kernel: Kernel) -> bool:
    """D's TMA stores issued by the producer warpgroup's idle warp 1 instead of by each consumer warp (the
    template's STORE_WARP): the configuration's `store_warp`, which constraints.check allows for cooperative
    data-parallel kernels whose D takes TMA stores."""
    return kernel.config.store_warp and uses_tma_store(kernel)


def is_streamk(kernel: Kernel) -> bool:
    return kernel.config.decomposition.kind is DecompKind.STREAM_K


def is_fused(kernel: Kernel) -> bool:
    """Split-K whose partials are summed in the GEMM launch by each tile's last CTA (no reduction launch)."""
    decomp = kernel.config.decomposition
    return decomp.kind is DecompKind.SPLIT_K and decomp.fused and decomp.splits > 1


def fused_counter_words(kernel: Kernel, problem: Problem) -> int:
    """u32 arrival counters at the head of a fused split-K workspace: one per CTA tile (cluster tiles times the
    cluster size), padded to 64 (256 bytes) as the template's fused_partials() computes it."""
    return (cluster_tiles(kernel, problem) * kernel.config.cluster.size + 63) // 64 * 64


def streamk_flag_words(grid: int) -> int:
    """u32 flags at the head of a Stream-K workspace: one per CTA, padded to 64 (256 bytes), as the kernel's
    sk_slot computes from gridDim.x."""
    return (grid + 63) // 64 * 64


def streamk_slices(kernel: Kernel, problem: Problem, grid: int) -> "tuple[int, int]":
    """(data-parallel tiles, K slices per remainder tile) of a Stream-K launch on `grid` CTAs, as the
    template's Walk computes them. 1 slice: the remainder runs as an ordinary partial wave; 0: range mode (the
    remainder's K iterations dealt out to every CTA in contiguous ranges, where the last wave is more than
    half full)."""
    tiles = cluster_tiles(kernel, problem)
    problem = gemm_problem(kernel, problem)
    rem, slices = streamk_remainder(tiles, grid, math.ceil(problem.k / kernel.config.cta.k))
    return (tiles if slices == 1 else tiles - rem), slices


def splits(kernel: Kernel) -> int:
    """K slices per output tile: the split-K factor, 1 for data-parallel."""
    decomp = kernel.config.decomposition
    return decomp.splits if decomp.kind is DecompKind.SPLIT_K else 1


def tensormap_specs(kernel: Kernel, problem: Problem, plan: "list[dict] | None" = None) -> "tuple[dict, dict]":
    """The two tensor-map parameter specs (manifest 'kind': 'tensormap') for A and B. A swapped kernel's tmA
    reads the caller's B (as B^T) and its tmB the caller's A; a packed operand's map reads its copy in the
    workspace (`plan`, placed: pack_plan then _place)."""
    cfg, ops = kernel.config, mainloop_operands(kernel)
    problem = gemm_problem(kernel, problem)
    a_name, b_name = ("B", "A") if cfg.swap_ab else ("A", "B")
    elt = ops.a_dtype.bytes
    a_k, b_k = a_is_kmajor(ops), b_is_kmajor(ops)
    a_split = cfg.cluster.n   # a cluster row (CTAs along N) multicasts A in one slice each
    b_split = cfg.cluster.m   # a cluster column (CTAs along M) multicasts B in one slice each
    a_box, a_swizzle = _box(cfg.cta.m, a_k, a_split, elt)
    b_box, b_swizzle = _box(cfg.cta.n, b_k, b_split, elt)
    tm_a = {"name": "tmA", "ctype": "CUtensorMap", "kind": "tensormap", "tensor": a_name, "dtype": ops.a_dtype.value,
            "dims": [problem.k, problem.m] if a_k else [problem.m, problem.k],
            "strides_bytes": [problem.lda * elt],
            "box": a_box, "swizzle": a_swizzle, "l2_promotion": L2_PROMOTION}
    tm_b = {"name": "tmB", "ctype": "CUtensorMap", "kind": "tensormap", "tensor": b_name, "dtype": ops.b_dtype.value,
            "dims": [problem.k, problem.n] if b_k else [problem.n, problem.k],
            "strides_bytes": [problem.ldb * elt],
            "box": b_box, "swizzle": b_swizzle, "l2_promotion": L2_PROMOTION}
    for copy in plan or ():
        if copy.get("big_in_place"):
            continue   # 3xTF32 reads the aligned operand itself as its big part
        spec = tm_a if copy["operand"] == "A" else tm_b
        spec.update(tensor="workspace", offset_bytes=copy["offset"], strides_bytes=[copy["packed_ld"] * elt],
                    dims=[copy["out_cols"], copy["out_rows"]])
    return tm_a, tm_b


def edge_boxes(kernel: Kernel) -> "tuple[bool, bool]":
    """Whether A and B have an edge map (tmAe, tmBe): the box that reaches past M (N), the last tile row's
    (column's) or, of an operand a cluster multicasts, the slice holding the edge, loads through a map whose box is
    cut to the rows left before it. A TMA box spends about as long on a row past the tensor's edge as on a real one
    (docs/perf-notes.md, "Rows past the edge": 129 x 4096 x 4096 ran 1.6x the time of 192 x 4096 x 4096 on the same
    64-row tiles). K-major operands (an MN-major box is 64 columns of the tile), not 3xTF32's three K segments
    (two maps each already)."""
    cfg, ops = kernel.config, mainloop_operands(kernel)
    if cfg.split3:
        return False, False
    return a_is_kmajor(ops), b_is_kmajor(ops)


def edge_tensormaps(kernel: Kernel, problem: Problem, tm_a: dict, tm_b: dict) -> "list[dict]":
    """tmAe and tmBe (where edge_boxes says so): tmA's and tmB's tensor, the box's rows those left in the box that
    holds the GEMM problem's last row of M (N): (M - 1) % rows + 1 of tmA's box rows (a tile's, or a multicast
    slice's; the box's own height when M is a multiple of it)."""
    gp = gemm_problem(kernel, problem)
    out = []
    for flag, spec, extent in zip(edge_boxes(kernel), (tm_a, tm_b), (gp.m, gp.n)):
        if flag:
            rows = (extent - 1) % spec["box"][1] + 1
            out.append({**spec, "name": spec["name"] + "e", "box": [spec["box"][0], rows]})
    return out


def split3_tensormaps(kernel: Kernel, problem: Problem, plan: "list[dict]") -> "list[dict]":
    """3xTF32's tmA2 and tmB2: the small parts' planes in the workspace, with the big maps' boxes (K-major,
    `plan` placed). The main loop reads A's third K segment and B's second through them."""
    tm_a, tm_b = tensormap_specs(kernel, problem, None)
    out = []
    for name, spec in (("A", tm_a), ("B", tm_b)):
        copy = next(c for c in plan if c["operand"] == name)
        out.append({**spec, "name": f"tm{name}2", "tensor": "workspace", "offset_bytes": copy["small_offset"],
                    "strides_bytes": [copy["packed_ld"] * copy["elt"]], "dims": [copy["out_cols"], copy["out_rows"]]})
    return out


def tensormap_d(kernel: Kernel, problem: Problem) -> dict:
    """The tensor map the TMA-store epilogue writes D through: boxes of 16 rows x 32 columns with the 64B
    swizzle, matching the template's per-warp store boxes."""
    ops = kernel.operands
    return tensormap_d_spec(problem, ops.c_dtype, EPI_BOX_COLS)


def tensormap_d_spec(problem: Problem, dtype, box_cols: int) -> dict:
    """tmD for store boxes of 16 rows x `box_cols` columns: 64-byte rows take the 64B swizzle, 128-byte rows
    the 128B one (the template's box_chunk places the chunks the same way)."""
    return {"name": "tmD", "ctype": "CUtensorMap", "kind": "tensormap", "tensor": "D", "dtype": dtype.value,
            "dims": [problem.n, problem.m], "strides_bytes": [problem.ldc * dtype.bytes],
            "box": [box_cols, EPI_BOX_ROWS], "swizzle": "64B" if box_cols * dtype.bytes == 64 else "128B",
            "l2_promotion": "NONE"}


def cluster_tiles(kernel: Kernel, problem: Problem) -> int:
    """Output tiles counted in clusters (tiles of D^T for a swapped kernel)."""
    cfg = kernel.config
    problem = gemm_problem(kernel, problem)
    tiles_m, tiles_n = math.ceil(problem.m / cfg.cta.m), math.ceil(problem.n / cfg.cta.n)
    return math.ceil(tiles_m / cfg.cluster.m) * math.ceil(tiles_n / cfg.cluster.n)


def work_units(kernel: Kernel, problem: Problem) -> int:
    """The scheduler's units of work, counted in clusters: each cluster tile once per K slice."""
    return cluster_tiles(kernel, problem) * splits(kernel)


# A Hopper GPC holds at most 9 TPCs of 2 SMs (GH100: 8 GPCs x 9 TPCs; the H100 SXM and H200 enable 66 of the 72
# TPCs), and a cluster's CTAs run in one GPC.
GPC_SMS = 18


def resident_clusters(sm_count: int, size: int) -> int:
    """Clusters of `size` CTAs (one CTA an SM) a GPU of `sm_count` SMs can hold at once where the driver was not
    asked (cuOccupancyMaxActiveClusters): a pair fits in a TPC, so SMs / 2 (66 on the H100 SXM, as the driver
    reports: docs/perf-notes.md); a larger cluster leaves each GPC's SMs past a multiple of its size idle, so at
    most size-multiples of GPCs of 18 SMs: 32 clusters of 4 on 132 SMs (8 GPCs of 16-18 usable), not 132 / 4 = 33.
    An upper bound: a chip whose GPCs enable fewer TPCs holds fewer, so launchers ask the driver."""
    if size <= 2:
        return max(1, sm_count // size)
    gpcs = -(-sm_count // GPC_SMS)
    return max(1, min(sm_count // size, gpcs * (GPC_SMS // size)))


def grid_size(kernel: Kernel, problem: Problem, sm_count: int, max_clusters: "int | None" = None) -> int:
    """CTAs to launch: one per cluster tile, or for a persistent kernel no more clusters than can be
    resident at once. `max_clusters` is the driver's cuOccupancyMaxActiveClusters where known, else
    resident_clusters: GPCs need not hold a whole number of clusters, and a persistent cluster that cannot
    start until another finishes its whole tile loop doubles the run time."""
    cfg = kernel.config
    clusters = work_units(kernel, problem)
    if cfg.persistent:
        resident = max_clusters or resident_clusters(sm_count, cfg.cluster.size)
        if is_streamk(kernel):
            # Stream-K cuts the tiles of the last partial wave into K slices (or K ranges) to fill it, so it
            # uses every resident slot even with fewer tiles than SMs (up to SK_MAX_SLICES slices per tile).
            dp, slices = streamk_slices(kernel, problem, resident)
            clusters = resident if slices == 0 else max(1, min(resident, dp + (clusters - dp) * slices))
        else:
            clusters = min(clusters, resident)
    return clusters * cfg.cluster.size


def launch(kernel: Kernel, problem: Problem, sm_count: "int | None" = None,
           max_clusters: "int | None" = None, plan: "list[dict] | None" = None) -> dict:
    """The GEMM launch of an sm90_wgmma kernel for `problem`, as a manifest 'launches' entry (`plan`: the
    placed pack copies its tensor maps read instead of A or B)."""
    cfg, ops = kernel.config, kernel.operands
    sm_count = sm_count or lookup_gpu("h100").sm_count
    ctype = f"const {ops.c_dtype.cuda_type}*"
    tm_a, tm_b = tensormap_specs(kernel, problem, plan)
    gp = gemm_problem(kernel, problem)
    lds = {copy["operand"]: copy["packed_ld"] for copy in plan or () if not copy.get("big_in_place")}
    # 3xTF32: the main loop runs three segments of K rounded up to whole k-tiles (each map zero-fills its tail).
    k = SPLIT_FACTOR * -(-gp.k // cfg.cta.k) * cfg.cta.k if cfg.split3 else gp.k
    scalars = [("M", gp.m), ("N", gp.n), ("K", k), ("lda", lds.get("A", gp.lda)), ("ldb", lds.get("B", gp.ldb)),
               ("ldc", problem.ldc), ("ldd", problem.ldc)]
    small = split3_tensormaps(kernel, problem, plan) if cfg.split3 and plan else []
    store_map = [tensormap_d(kernel, problem)] if uses_tma_store(kernel) else []
    params = [tm_a, tm_b] + edge_tensormaps(kernel, problem, tm_a, tm_b) + remainder_tensormap(kernel, tm_b) + small \
        + store_map + [
              {"name": "B", "ctype": ctype, "kind": "tensor",   # read only by a cp.async B
               "tensor": "A" if cfg.swap_ab else "B"},
              {"name": "C", "ctype": ctype, "kind": "tensor", "tensor": "C"},
              {"name": "D", "ctype": f"{ops.c_dtype.cuda_type}*", "kind": "tensor", "tensor": "D"},
              {"name": "bias", "ctype": ctype, "kind": "tensor", "tensor": "bias"}]
    if has_scales(kernel):   # the caller's A and B scales, whichever operand the swapped main loop reads as A
        shape_a, shape_b = problem.scale_shapes   # the manifest names each scale tensor's shape
        params += [{"name": "scale_a", "ctype": "const float*", "kind": "tensor", "tensor": "scale_a",
                    "shape": list(shape_a)},
                   {"name": "scale_b", "ctype": "const float*", "kind": "tensor", "tensor": "scale_b",
                    "shape": list(shape_b)}]
    if ops.row_sums:   # D's by-product: sum_k A[m, k] per row of A, in C's dtype (rows past M not written)
        params.append({"name": "row_sums", "ctype": f"{ops.c_dtype.cuda_type}*", "kind": "tensor",
                       "tensor": "row_sums", "shape": [problem.m]})
    params += [{"name": "workspace", "ctype": "float*", "kind": "workspace"}]
    params += [{"name": n, "ctype": "int", "kind": "scalar", "value": v} for n, v in scalars]
    params += [{"name": "alpha", "ctype": "float", "kind": "scalar", "value": problem.epilogue.alpha},
               {"name": "beta", "ctype": "float", "kind": "scalar", "value": problem.epilogue.beta}]
    # programmatic: launched with PDL. The kernel reads and writes global memory only after griddepcontrol.wait,
    # so it may start (barrier set-up, tensor-map prefetches) while the previous kernel of the stream finishes.
    # (Prefetching the first stages' boxes into L2 there as well cost 0.1-3.4 us a call: docs/perf-notes.md,
    # "PDL's L2 prefetch".)
    return {"entry": kernel.name, "grid": [grid_size(kernel, problem, sm_count, max_clusters), 1, 1],
            "block": [cfg.threads, 1, 1], "cluster": [cfg.cluster.size, 1, 1],
            "dynamic_smem": smem_bytes(cfg, ops), "programmatic": True, "params": params}


def launches(kernel: Kernel, problem: Problem, sm_count: "int | None" = None,
             max_clusters: "int | None" = None) -> "tuple[list[dict], int]":
    """The manifest's launches and workspace bytes: the GEMM alone, or for split-K the partial-sum kernel
    then `<name>_reduce` over the same parameters (the sm80 family's reduce ABI and grid), with an fp32
    workspace[splits][M][N] (for a swapped kernel [splits][N][M], D^T's partials); for Stream-K the GEMM alone over [flags][one BM x BN fp32 partial per CTA].
    Operands TMA cannot read in place are packed first (pack_plan): one <name>_pack launch each, into the
    workspace after what the GEMM itself uses."""
    plan = pack_plan(kernel, problem)
    # The GEMM's own workspace size does not depend on where the copies go (a persistent grid is fixed by the
    # problem and the SMs), so it is computed first, and the copies placed after it.
    runs, own = _gemm_launches(kernel, problem, sm_count, max_clusters, None)
    if not plan:
        return runs, own
    end = _place(plan, own)
    runs, _ = _gemm_launches(kernel, problem, sm_count, max_clusters, plan)
    return [pack_launch(kernel, plan)] + runs, end


def _gemm_launches(kernel, problem, sm_count, max_clusters, plan) -> "tuple[list[dict], int]":
    main = launch(kernel, problem, sm_count, max_clusters, plan)
    if is_streamk(kernel):
        grid = main["grid"][0]
        return [main], streamk_flag_words(grid) * 4 + grid * kernel.config.cta.m * kernel.config.cta.n * 4
    s = splits(kernel)
    if s == 1:
        return [main], 0
    if is_fused(kernel):
        return [main], fused_counter_words(kernel, problem) * 4 + s * problem.m * problem.n * 4
    pairs = problem.m * math.ceil(problem.n / 2)  # one reduction thread per two columns of D (caller's frame)
    reduce = {"entry": f"{kernel.name}_reduce", "grid": [math.ceil(pairs / REDUCE_THREADS), 1, 1],
              "block": [REDUCE_THREADS, 1, 1], "cluster": [1, 1, 1], "dynamic_smem": 0, "params": main["params"]}
    return [main, reduce], s * problem.m * problem.n * 4


def manifest_launches(kernel: Kernel, problem: Problem, sm_count: "int | None" = None,
                      max_clusters: "int | None" = None) -> "tuple[list[dict], int, dict]":
    """launches() plus the workspace's zeroing rule (manifest 'workspace_zero'): Stream-K's flag words once
    when bound (the kernel leaves them zero); split-K writes every partial before reading it, so nothing."""
    runs, workspace = launches(kernel, problem, sm_count, max_clusters)
    if is_streamk(kernel):
        main = next(r for r in runs if r["entry"] == kernel.name)
        return runs, workspace, {"bytes": streamk_flag_words(main["grid"][0]) * 4, "when": "bind"}
    if is_fused(kernel):
        # The last CTA of each tile resets its counter, so the counters are zeroed once, when bound.
        return runs, workspace, {"bytes": fused_counter_words(kernel, problem) * 4, "when": "bind"}
    return runs, workspace, {"bytes": 0, "when": "run"}


def kernel_for(problem: Problem, config, arch: Arch = Arch.SM90A) -> Kernel:
    """Bind a configuration to `problem`'s operands for sm_90a."""
    return Kernel(arch, problem.operands, config)


__all__ = ["SPLIT_FACTOR", "edge_boxes", "edge_tensormaps", "remainder_tensormap", "split3_tensormaps", "TRANSPOSE_TILE_BYTES", "TRANSPOSE_TILE_ROWS", "has_scales", "mainloop_operands", "packed", "tile_pack", "transposed", "pack_plan", "pack_launch", "prepass_bytes", "PACK_THREADS", "PACK_CHUNK", "PACK_ROWS", "manifest_launches", "is_streamk", "is_fused", "fused_counter_words", "streamk_flag_words", "streamk_slices", "tensormap_specs", "grid_size", "resident_clusters", "GPC_SMS", "cluster_tiles", "work_units", "splits", "launch",
           "launches",
           "kernel_for", "a_is_kmajor", "b_is_kmajor", "gemm_problem", "gemm_operands"]
