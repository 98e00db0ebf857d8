"""The fp8/tf32 pack launch (templates/sm90_wgmma/pack.cuh.j2, tile_pack_kernel) run on the CPU: the rendered CUDA
of the <name>_pack entry is compiled as C++ with a thin emulation of the CUDA built-ins (one std::thread per CUDA
thread, __syncthreads a std::barrier, __byte_perm by its definition, misaligned vector accesses trapped by
-fsanitize=alignment) and launched over the manifest's own grid and parameters. The copies it writes into the
workspace must be the operands, K-major (transposed where the layout is MN-major, split for 3xTF32), at the
offsets and leading dimensions the GEMM's tensor maps read. This pins the indexing, the shared-memory swizzle,
the byte transposes, the alignment fallbacks and the edges without a GPU (tests/test_layouts_gpu.py runs the
whole product on one)."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

from gemmgen import Arch, Kernel, Problem, TileConfig
from gemmgen.codegen.render import render
from gemmgen.model.arch import lookup_gpu
from gemmgen.rank.space import default_config
from gemmgen.runtime.manifest import make_manifest

H100 = lookup_gpu("h100")
CXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs g++ (C++20) to run the pack kernel on the CPU")

PRELUDE = r"""
#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
typedef unsigned int u32;
struct Dim { unsigned x = 0, y = 0, z = 0; };
thread_local Dim threadIdx, blockIdx;
Dim gridDim, blockDim;
std::barrier<>* g_bar;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __syncthreads() g_bar->arrive_and_wait()
struct alignas(16) uint4 { u32 x, y, z, w; };
struct alignas(8) uint2 { u32 x, y; };
inline uint4 make_uint4(u32 a, u32 b, u32 c, u32 d) { return {a, b, c, d}; }
template <class T> inline T __ldg(const T* p) { return *p; }   // -fsanitize=alignment checks the vector reads
inline u32 __byte_perm(u32 x, u32 y, u32 s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    u32 r = 0;
    for (int i = 0; i < 4; ++i) r |= (u32)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline float __uint_as_float(u32 x) { float f; std::memcpy(&f, &x, 4); return f; }
inline u32 __float_as_uint(float f) { u32 x; std::memcpy(&x, &f, 4); return x; }
using std::min;
"""

MAIN = r"""
int main(int argc, char** argv) {
    FILE* f = std::fopen(argv[1], "rb");
    long long h[19];
    if (std::fread(h, 8, 19, f) != 19) return 3;
    unsigned char* arena = static_cast<unsigned char*>(std::aligned_alloc(256, (h[0] + 255) / 256 * 256));
    unsigned char* ws = static_cast<unsigned char*>(std::aligned_alloc(1024, (h[1] + 1023) / 1024 * 1024));
    if (std::fread(arena, 1, h[0], f) != (size_t)h[0]) return 3;
    std::fclose(f);
    std::memset(ws, 0xA5, h[1]);   // poison: what the copy leaves unwritten shows
    gridDim = {(unsigned)h[2], (unsigned)h[3], (unsigned)h[4]};
    blockDim = {256, 1, 1};
    const long long* c0 = h + 5;
    const long long* c1 = h + 12;
    std::barrier<> bar(256);
    g_bar = &bar;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 256; ++t)
        threads.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            for (unsigned z = 0; z < gridDim.z; ++z)
                for (unsigned y = 0; y < gridDim.y; ++y)
                    for (unsigned x = 0; x < gridDim.x; ++x) {
                        blockIdx = {x, y, z};
                        pack_entry(arena + c0[0], ws + c0[1], (int)c0[2], (int)c0[3], (int)c0[4], (int)c0[5],
                                   (int)c0[6], arena + c1[0], ws + c1[1], (int)c1[2], (int)c1[3], (int)c1[4],
                                   (int)c1[5], (int)c1[6]);
                        g_bar->arrive_and_wait();   // the block is done before the next one reuses the tile
                    }
        });
    for (auto& th : threads) th.join();
    FILE* o = std::fopen(argv[2], "wb");
    std::fwrite(ws, 1, h[1], o);
    std::fclose(o);
    return 0;
}
"""


def kernel_source(kernel: Kernel) -> str:
    """The rendered <name>_pack entry (the tile copy is the file's last piece), renamed pack_entry, with the one
    PTX instruction (cvt.rna.tf32.f32: round to nearest, ties away, to 10 mantissa bits) spelt in C++."""
    source = render(kernel, H100)
    start = source.index("constexpr int PK_ELT")
    body = source[start:].replace(f"{kernel.name}_pack(", "pack_entry(")
    body = re.sub(r'asm\("cvt\.rna\.tf32\.f32[^\n]*', "r = (x + 0x1000u) & 0xffffe000u;", body)
    assert "asm(" not in body
    return PRELUDE + body + MAIN


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """Compile the pack entry of a kernel once per element size."""
    built = {}

    def get(kernel: Kernel, elt: int):
        if elt not in built:
            folder = tmp_path_factory.mktemp(f"pack{elt}")
            (folder / "pack.cpp").write_text(kernel_source(kernel))
            exe = folder / "pack"
            subprocess.run([CXX, "-std=c++20", "-O1", "-pthread", "-fsanitize=alignment",
                            "-fno-sanitize-recover=all", str(folder / "pack.cpp"), "-o", str(exe)],
                           check=True, capture_output=True, text=True)
            built[elt] = exe
        return built[elt]

    return get


def tf32(x: np.ndarray) -> np.ndarray:
    return ((x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def storage(rows: int, cols: int, ld: int, elt: int, rng) -> np.ndarray:
    """A rows x ld buffer of random elements (bytes for fp8, float32 for tf32); cols of each row are the operand."""
    if elt == 1:
        return rng.integers(0, 256, size=(rows, ld), dtype=np.uint8)
    return rng.standard_normal((rows, ld)).astype(np.float32)


def run_pack(exe, tmp_path, manifest, operands: dict, pad: int):
    """Launch the manifest's pack entry on `operands` ({tensor: storage}), each placed `pad` bytes past a
    256-byte boundary of the arena; the workspace it leaves."""
    pack = manifest["launches"][0]
    params = {p["name"]: p for p in pack["params"]}
    arena, where = b"", {}
    for name, data in operands.items():
        arena += b"\0" * (-len(arena) % 256 + pad)
        where[name] = len(arena)
        arena += data.tobytes()
    header = [len(arena), manifest["workspace_bytes"], *pack["grid"]]
    for z in range(2):
        header += [where[params[f"src{z}"]["tensor"]], params[f"dst{z}"]["offset_bytes"]]
        header += [params[f"{key}{z}"]["value"] for key in ("rows", "cols", "ld_src", "ld_dst", "mode")]
    job, out = tmp_path / "job.bin", tmp_path / "ws.bin"
    job.write_bytes(struct.pack("<19q", *header) + arena)
    subprocess.run([str(exe), str(job), str(out)], check=True, timeout=120, capture_output=True, text=True)
    return np.frombuffer(out.read_bytes(), dtype=np.uint8), params, pack["grid"][2]


CASES = [
    # (dtype, a, b, m, n, k, split3, pad): pad moves the sources off 16-byte boundaries (rows still 4-byte aligned).
    ("e4m3", "col", "row", 1000, 777, 1100, False, 0),    # both transposed; rows of 1000 and 777 bytes
    ("e4m3", "col", "row", 272, 160, 384, False, 0),       # 16-byte rows: the one-load path, whole tiles
    ("e5m2", "row", "row", 131, 300, 1001, False, 4),      # A K-major, misaligned (straight copy); B transposed
    ("e4m3", "col", "col", 333, 257, 4099, False, 8),      # A transposed over a tall K; B straight, rows of 4099
    ("f32", "col", "row", 333, 4099, 257, False, 0),       # tf32, both transposed
    ("f32", "row", "row", 100, 65, 129, False, 4),         # A straight (misaligned rows), B transposed
    ("f32", "col", "row", 1000, 777, 1001, True, 0),       # 3xTF32: transposed, split, K not a multiple of 4
    ("f32", "row", "row", 200, 130, 1001, True, 0),        # 3xTF32: A straight + split, B transposed + split
    ("f32", "col", "col", 333, 411, 257, True, 0),         # 3xTF32: planes of 333 x 288 floats (not 1 KB multiples)
]
SPLIT3 = {"family": "sm90_wgmma", "cta": "128x128x32", "warp": "64x128x32", "mma": "64x128x8", "stages": 4,
          "warp_specialized": True, "persistent": True, "split3": True, "promote": 1}


@pytest.mark.parametrize("dtype,a,b,m,n,k,split3,pad", CASES)
def test_the_pack_entry_writes_k_major_copies_the_tensor_maps_read(build, tmp_path, dtype, a, b, m, n, k, split3,
                                                                    pad):
    check_pack(build, tmp_path, dtype, a, b, m, n, k, split3, pad)


@pytest.mark.parametrize("dtype", ["e4m3", "f32"])
def test_rows_past_the_grid_s_y_extent_are_walked_by_the_grid_stride_loop(build, tmp_path, monkeypatch, dtype):
    # The y grid is capped (65535 tiles of 128 rows: K beyond 8M); capped at 1, one CTA row walks every tile.
    from gemmgen.families.sm90_wgmma import launch

    monkeypatch.setattr(launch, "PACK_MAX_GRID_Y", 1)
    check_pack(build, tmp_path, dtype, "col", "row", 300, 200, 700, False, 0)


FP8_SWAP = {"family": "sm90_wgmma", "cta": "128x32x128", "warp": "64x32x128", "mma": "64x32x32", "stages": 6,
            "warp_specialized": True, "persistent": True, "swap_ab": True}


@pytest.mark.parametrize("a,b", [("row", "row"), ("col", "col"), ("col", "row")])
def test_the_swapped_kernel_s_copies_are_the_caller_s_operands_k_major(build, tmp_path, a, b):
    # Swapped, the main loop's A is B^T (K-major: N rows of K, the caller's B K-major) and its B is A^T.
    check_pack(build, tmp_path, "e4m3", a, b, 24, 3001, 1040, False, 0, FP8_SWAP)


def check_pack(build, tmp_path, dtype, a, b, m, n, k, split3, pad, config=None):
    problem = Problem.create(m, n, k, dtype, a, b, fp32_math="3xtf32" if split3 else None)
    config = TileConfig.from_dict(config or SPLIT3) if split3 or config else default_config(problem, H100,
                                                                                              Arch.SM90A)
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    manifest = make_manifest(kernel, problem)
    assert manifest["launches"][0]["entry"] == f"{kernel.name}_pack"
    elt = problem.a_dtype.bytes
    rng = np.random.default_rng(7)
    # Storage of each operand: A (M x K) row-major is M rows of K, column-major K rows of M; B likewise.
    shapes = {"A": (m, k) if a == "row" else (k, m), "B": (k, n) if b == "row" else (n, k)}
    data = {name: storage(rows, cols, cols, elt, rng) for name, (rows, cols) in shapes.items()}
    ws, params, copies = run_pack(build(kernel, elt), tmp_path, manifest, data, pad)
    gemm = manifest["launches"][-1]
    maps = {p["tensor"] if p["tensor"] != "workspace" else p["offset_bytes"]: p
            for p in gemm["params"] if p["kind"] == "tensormap"}
    for z in range(copies):
        name = params[f"src{z}"]["tensor"]
        src = data[name]
        # K-major: A as M rows of K, B as N rows of K.
        kmajor = src if (name, (a if name == "A" else b)) in (("A", "row"), ("B", "col")) else src.T
        offset, ld = params[f"dst{z}"]["offset_bytes"], params[f"ld_dst{z}"]["value"]
        planes = [(offset, kmajor)]
        if split3:
            # The copy is the big part (wgmma reads it truncated to tf32); one plane further, the small part
            # tf32(x - trunc(x)), rounded to nearest: 3xTF32's three K segments read both (tmA2 / tmB2).
            trunc = (kmajor.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
            plane = kmajor.shape[0] * ld * elt
            planes.append((offset + plane, tf32(kmajor - trunc)))
            assert maps[offset + plane]["name"] == ("tmA2" if name == "A" else "tmB2")
        for where, want in planes:
            tm = maps[where]   # the GEMM reads this copy: the map's extent and stride are the copy's
            assert tm["dims"] == [want.shape[1], want.shape[0]] and tm["strides_bytes"] == [ld * elt]
            rows_bytes = ws[where: where + want.shape[0] * ld * elt].reshape(want.shape[0], ld * elt)
            got = rows_bytes[:, : want.shape[1] * elt].copy().view(want.dtype)
            np.testing.assert_array_equal(got, want, err_msg=f"copy {z} of {name} at {where}")
