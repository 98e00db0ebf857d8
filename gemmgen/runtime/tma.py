"""TMA tensor maps and the sm90 launch, through cuda.bindings.driver (imported lazily, every code checked).

`encode(spec, base_ptr)` turns a manifest 'tensormap' parameter spec into the 128-byte CUtensorMap the
kernel takes by value; `launch_sm90(...)` launches a kernel from a manifest launch entry, with a cluster
dimension attribute when the entry asks for one.
"""
from __future__ import annotations

import ctypes

from ..model.errors import CudaError, InvalidInput

TENSORMAP_BYTES = 128
_ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}
# CU_TENSOR_MAP_L2_PROMOTION_* by the spec's "l2_promotion" ("none" and "NONE" alike). Manifests written
# before the key existed were encoded with 256B and keep it; new ones say 128B (families/sm90.L2_PROMOTION).
L2_PROMOTIONS = ("NONE", "64B", "128B", "256B")
LEGACY_L2_PROMOTION = "256B"


def _driver():
    from cuda.bindings import driver  # lazy: the model and rendering never need cuda-python
    return driver


def check(call: str, result):
    """Unpack a cuda.bindings return tuple, raising CudaError on anything but CUDA_SUCCESS."""
    driver = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        code = int(err)
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        raise CudaError(call, code, name.decode() if isinstance(name, bytes) else str(name),
                        text.decode() if isinstance(text, bytes) else str(text))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def validate_spec(spec: dict) -> None:
    """The tensor-map rules TMA imposes (CUDA driver API, cuTensorMapEncodeTiled), as InvalidInput."""
    dtype = spec.get("dtype")
    if dtype not in _ELEMENT_BYTES:
        raise InvalidInput(f"tensormap dtype must be one of {sorted(_ELEMENT_BYTES)}", dtype)
    elt = _ELEMENT_BYTES[dtype]
    dims, strides, box = list(spec["dims"]), list(spec["strides_bytes"]), list(spec["box"])
    if len(dims) != 2 or len(strides) != 1 or len(box) != 2:
        raise InvalidInput("a 2-D tensormap has 2 dims, 1 stride and a 2-D box", spec.get("name"))
    if any(d <= 0 for d in dims):
        raise InvalidInput("tensormap dims must be positive", dims)
    if strides[0] % 16 or strides[0] < dims[0] * elt:
        raise InvalidInput("tensormap stride must be a multiple of 16 bytes covering the inner dim", strides[0],
                           "leading dimensions that are not 16-byte multiples cannot use TMA")
    if not all(1 <= b <= 256 for b in box) or (box[0] * elt) % 16:
        raise InvalidInput("tensormap box extents must be 1..256 with the inner one a multiple of 16 bytes", box)
    swizzle = spec.get("swizzle", "128B")
    if swizzle not in ("128B", "64B", "32B", "none"):
        raise InvalidInput("tensormap swizzle must be one of 128B, 64B, 32B, none", swizzle)
    span = {"128B": 128, "64B": 64, "32B": 32}.get(swizzle)
    if span and box[0] * elt > span:
        raise InvalidInput(f"with the {swizzle} swizzle the inner box is at most {span} bytes", box[0] * elt)
    if str(spec.get("l2_promotion", LEGACY_L2_PROMOTION)).upper() not in L2_PROMOTIONS:
        raise InvalidInput(f"tensormap l2_promotion must be one of {list(L2_PROMOTIONS)}", spec.get("l2_promotion"))


def encode(spec: dict, base_ptr: int) -> bytes:
    """cuTensorMapEncodeTiled over the tensor at `base_ptr` (16-byte aligned), as the kernel's 128 bytes."""
    driver = _driver()
    validate_spec(spec)
    if base_ptr % 16:
        raise InvalidInput("a TMA tensor's address must be 16-byte aligned", hex(base_ptr))
    # fp8 has no tensor-map type of its own: TMA moves bytes, and wgmma reads them as e4m3/e5m2.
    dtype = getattr(driver.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + {
        "bf16": "BFLOAT16", "f16": "FLOAT16", "f32": "FLOAT32", "e4m3": "UINT8", "e5m2": "UINT8"}[spec["dtype"]])
    swizzle = {"128B": driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
               "64B": driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
               "32B": driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
               "none": driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE}[spec.get("swizzle", "128B")]
    promotion = getattr(driver.CUtensorMapL2promotion, "CU_TENSOR_MAP_L2_PROMOTION_" + {
        "NONE": "NONE", "64B": "L2_64B", "128B": "L2_128B", "256B": "L2_256B"}[
        str(spec.get("l2_promotion", LEGACY_L2_PROMOTION)).upper()])
    tensor_map = check("cuTensorMapEncodeTiled", driver.cuTensorMapEncodeTiled(
        dtype, 2, base_ptr,
        [driver.cuuint64_t(int(d)) for d in spec["dims"]],
        [driver.cuuint64_t(int(s)) for s in spec["strides_bytes"]],
        [driver.cuuint32_t(int(b)) for b in spec["box"]],
        [driver.cuuint32_t(1), driver.cuuint32_t(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle,
        promotion,
        # Out-of-bounds elements read as zero, so partial tiles in M, N and K add nothing to the sum.
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    raw = b"".join(int(word).to_bytes(8, "little") for word in tensor_map.opaque)
    if len(raw) != TENSORMAP_BYTES:
        raise CudaError("cuTensorMapEncodeTiled", -1, "unexpected CUtensorMap size", str(len(raw)))
    return raw


class _TensorMapParam(ctypes.Structure):
    # Host copy only: the driver places it at the kernel's 64-byte aligned parameter offset.
    _fields_ = [("data", ctypes.c_uint8 * TENSORMAP_BYTES)]


_CTYPES = {"int": ctypes.c_int32, "float": ctypes.c_float}


def pack_params(params: "list[dict]", values: dict) -> "tuple[ctypes.Array, list]":
    """kernelParams for cuLaunchKernel: an array of pointers to each argument's host copy.

    `values` maps a param name to its value: bytes(128) for tensormaps, an int device pointer (0 = null)
    for tensors and the workspace; scalars default to the manifest's "value".
    """
    holders = []
    for p in params:
        kind = p["kind"]
        value = values.get(p["name"], p.get("value"))
        if kind == "tensormap":
            if not isinstance(value, (bytes, bytearray)) or len(value) != TENSORMAP_BYTES:
                raise InvalidInput("a tensormap argument must be the 128 bytes tma.encode returns", p["name"])
            holder = _TensorMapParam()
            ctypes.memmove(holder.data, bytes(value), TENSORMAP_BYTES)
        elif kind in ("tensor", "workspace"):
            holder = ctypes.c_uint64(int(value or 0))
        elif kind == "scalar":
            from .launch import scalar   # refuses a value the C type would wrap

            holder = scalar(_CTYPES[p["ctype"]], value, p["name"])
        else:
            raise InvalidInput("param kind must be tensor, tensormap, workspace or scalar", kind)
        holders.append(holder)
    pointers = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
    return pointers, holders


def prepare_function(function, dynamic_smem: int) -> None:
    """Raise the function's dynamic shared-memory limit (needed above 48 KB)."""
    driver = _driver()
    check("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", driver.cuFuncSetAttribute(
        function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(dynamic_smem)))


def _launch_config(launch: dict, stream=None):
    """CUlaunchConfig for a manifest launch entry, with the cluster dimension attribute."""
    driver = _driver()
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = launch["grid"]
    config.blockDimX, config.blockDimY, config.blockDimZ = launch["block"]
    config.sharedMemBytes = int(launch["dynamic_smem"])
    if stream is not None:
        config.hStream = stream
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = launch.get("cluster", [1, 1, 1])
    attrs = [attr]
    policy = launch.get("cluster_policy")   # optional, for experiments (ac47e8f:scripts/ab_lab.py --set cluster_policy=)
    if policy:
        extra = driver.CUlaunchAttribute()
        extra.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
        extra.value.clusterSchedulingPolicyPreference = getattr(
            driver.CUclusterSchedulingPolicy, "CU_CLUSTER_SCHEDULING_POLICY_" + str(policy).upper())
        attrs.append(extra)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


def max_active_clusters(function, launch: dict) -> int:
    """How many clusters of the entry's shape can be resident at once (cuOccupancyMaxActiveClusters).

    A persistent grid larger than this leaves clusters waiting for others to finish their whole tile loop.
    """
    driver = _driver()
    probe = dict(launch, grid=list(launch.get("cluster", [1, 1, 1])))
    return int(check("cuOccupancyMaxActiveClusters",
                     driver.cuOccupancyMaxActiveClusters(function, _launch_config(probe))))


def launch_sm90(function, launch: dict, values: dict, stream=0) -> None:
    """Launch `function` as a manifest launch entry describes: grid, block, cluster, dynamic smem, params.

    `function` is a CUfunction whose dynamic shared-memory limit was raised (prepare_function).
    """
    driver = _driver()
    pointers, holders = pack_params(launch["params"], values)
    grid, block, cluster = launch["grid"], launch["block"], launch.get("cluster", [1, 1, 1])
    stream = stream if isinstance(stream, driver.CUstream) else driver.CUstream(int(stream))
    smem = int(launch["dynamic_smem"])
    if list(cluster) == [1, 1, 1]:
        check("cuLaunchKernel", driver.cuLaunchKernel(function, *grid, *block, smem, stream,
                                                      ctypes.addressof(pointers), 0))
    else:
        check("cuLaunchKernelEx", driver.cuLaunchKernelEx(_launch_config(launch, stream), function,
                                                          ctypes.addressof(pointers), 0))
    del holders  # the driver copied the arguments at launch


__all__ = ["encode", "validate_spec", "L2_PROMOTIONS", "LEGACY_L2_PROMOTION", "pack_params", "prepare_function", "launch_sm90", "max_active_clusters",
           "check", "TENSORMAP_BYTES"]
