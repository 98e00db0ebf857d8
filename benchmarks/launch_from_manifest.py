#!/usr/bin/env python3
"""Launch an exported gemmgen cubin with cuda-python from its manifest alone (no gemmgen import),
and check it against torch.matmul on fresh random inputs.

    python3 benchmarks/launch_from_manifest.py out/<name>.json

Needs cuda-bindings and torch (torch only makes and checks the operands; the launch is the driver API).
"""
import ctypes
import json
import sys
from pathlib import Path

import torch
from cuda.bindings import driver as cu


def check(result):
    """Raise on any CUresult but CUDA_SUCCESS, naming the error; return the call's values."""
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {cu.cuGetErrorName(err)[1].decode()}")
    return values[0] if len(values) == 1 else values


def tensor_map(spec, ptr):
    """The 128-byte CUtensorMap a 'tensormap' parameter describes (sm90 kernels)."""
    dtypes = {"bf16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
              "f16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}
    swizzle = getattr(cu.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_" + spec.get("swizzle", "128B").upper())
    # Manifests without "l2_promotion" predate the key and were encoded with 256B.
    promotion = spec.get("l2_promotion", "256B").upper()
    promotion = getattr(cu.CUtensorMapL2promotion,
                        "CU_TENSOR_MAP_L2_PROMOTION_" + (promotion if promotion == "NONE" else "L2_" + promotion))
    tmap = check(cu.cuTensorMapEncodeTiled(
        dtypes[spec["dtype"]], len(spec["dims"]), ptr, [cu.cuuint64_t(d) for d in spec["dims"]],
        [cu.cuuint64_t(s) for s in spec["strides_bytes"]], [cu.cuuint32_t(b) for b in spec["box"]],
        [cu.cuuint32_t(1)] * len(spec["dims"]), cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
        promotion,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    return b"".join(int(w).to_bytes(8, "little") for w in tmap.opaque)


def pack(params, ptrs, workspace):
    """kernelParams: a void* array pointing at a host copy of each argument, in manifest order."""
    scalars = {"int": ctypes.c_int32, "float": ctypes.c_float}
    keep = []
    for p in params:
        if p["kind"] == "tensor":
            keep.append(ctypes.c_uint64(ptrs.get(p["tensor"], 0)))
        elif p["kind"] == "workspace":   # the workspace, or a region of it (a packed operand's copy)
            keep.append(ctypes.c_uint64(workspace + p.get("offset_bytes", 0)))
        elif p["kind"] == "scalar":
            keep.append(scalars[p["ctype"]](p["value"]))
        elif p["kind"] == "tensormap":
            base = workspace + p.get("offset_bytes", 0) if p["tensor"] == "workspace" else ptrs[p["tensor"]]
            keep.append((ctypes.c_ubyte * 128).from_buffer_copy(tensor_map(p, base)))
    array = (ctypes.c_void_p * len(keep))(*[ctypes.addressof(k) for k in keep])
    return array, keep


def main(path):
    manifest = json.loads(Path(path).read_text())
    cubin = (Path(path).parent / manifest["cubin"]).read_bytes()
    p = manifest["problem"]
    m, n, k = p["M"], p["N"], p["K"]
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[p["a_dtype"]]

    # Operands in the manifest's layouts: a col-major A (M x K) is a K x M array seen transposed.
    A = torch.empty(m, k, dtype=dtype, device="cuda") if p["a_layout"] == "row" else \
        torch.empty(k, m, dtype=dtype, device="cuda").t()
    B = torch.empty(k, n, dtype=dtype, device="cuda") if p["b_layout"] == "row" else \
        torch.empty(n, k, dtype=dtype, device="cuda").t()
    A.uniform_(-1, 1)
    B.uniform_(-1, 1)
    C = torch.rand(m, n, dtype=dtype, device="cuda") - 0.5 if p["beta"] != 0 else None
    bias = torch.rand(n, dtype=dtype, device="cuda") - 0.5 if p["bias"] else None
    D = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")  # poison: unwritten entries stay NaN
    workspace = torch.zeros(max(1, manifest.get("workspace_bytes", 0)), dtype=torch.uint8, device="cuda")
    ptrs = {"A": A.data_ptr(), "B": B.data_ptr(), "D": D.data_ptr(),
            "C": C.data_ptr() if C is not None else 0, "bias": bias.data_ptr() if bias is not None else 0}

    check(cu.cuInit(0))
    torch.cuda.synchronize()  # torch made the primary context current on this thread; the driver API uses it
    module = check(cu.cuModuleLoadData(cubin))
    stream = torch.cuda.current_stream().cuda_stream
    workspace.zero_()  # zeroed before each launch sequence (split-K accumulates into it)
    for launch in manifest["launches"]:
        function = check(cu.cuModuleGetFunction(module, launch["entry"].encode()))
        if launch["dynamic_smem"] > 48 * 1024:
            check(cu.cuFuncSetAttribute(function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        launch["dynamic_smem"]))
        array, keep = pack(launch["params"], ptrs, workspace.data_ptr())
        if list(launch.get("cluster", [1, 1, 1])) == [1, 1, 1]:
            check(cu.cuLaunchKernel(function, *launch["grid"], *launch["block"], launch["dynamic_smem"], stream,
                                    ctypes.addressof(array), 0))
        else:
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = launch["grid"]
            config.blockDimX, config.blockDimY, config.blockDimZ = launch["block"]
            config.sharedMemBytes, config.hStream = launch["dynamic_smem"], cu.CUstream(stream)
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = launch["cluster"]
            config.attrs, config.numAttrs = [attr], 1
            check(cu.cuLaunchKernelEx(config, function, ctypes.addressof(array), 0))
    check(cu.cuCtxSynchronize())

    ref = p["alpha"] * (A.float() @ B.float())
    if C is not None:
        ref += p["beta"] * C.float()
    if bias is not None:
        ref += bias.float()
    if p["activation"] == "relu":
        ref = torch.relu(ref)
    elif p["activation"] == "gelu":
        ref = torch.nn.functional.gelu(ref, approximate="tanh")
    rel = ((D.float() - ref).norm() / ref.norm()).item()
    limit = 1e-2 if p["c_dtype"] == "bf16" else 2e-3
    ok = bool(torch.isfinite(D).all()) and rel < limit
    print(f"{manifest['name']}: relative error {rel:.2e} (limit {limit:.0e}) -> {'OK' if ok else 'WRONG'}")
    check(cu.cuModuleUnload(module))
    return 0 if ok else 1


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", help="an exported bundle's manifest .json")
    sys.exit(main(parser.parse_args().manifest))
