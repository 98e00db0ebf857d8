"""Data types, compute architectures and the GPU catalogue (gemmgen/model/data/gpus.yaml)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from pathlib import Path

from .errors import InvalidInput
from . import parse

CATALOGUE_PATH = Path(__file__).parent / "data" / "gpus.yaml"


class DType(str, Enum):
    """Element types. The value is the short spelling used on the command line and in names."""

    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    E4M3 = "e4m3"  # fp8: room in the model, no kernel family yet
    E5M2 = "e5m2"

    @property
    def bytes(self) -> int:
        return {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}[self.value]

    @property
    def cuda_type(self) -> str:
        return {"bf16": "__nv_bfloat16", "f16": "__half", "f32": "float",
                "e4m3": "__nv_fp8_e4m3", "e5m2": "__nv_fp8_e5m2"}[self.value]

    @property
    def ptx(self) -> str:
        return {"bf16": "bf16", "f16": "f16", "f32": "f32", "e4m3": "e4m3", "e5m2": "e5m2"}[self.value]

    @classmethod
    def parse(cls, text: "str | DType") -> "DType":
        if isinstance(text, DType):
            return text
        # tf32 is how fp32 inputs are multiplied (their default math), so `--dtype tf32` asks for f32 inputs;
        # the torch names of the fp8 types are accepted as they are spelled there.
        aliases = {"bfloat16": "bf16", "fp16": "f16", "float16": "f16", "half": "f16",
                   "fp32": "f32", "float32": "f32", "float": "f32", "tf32": "f32",
                   "fp8": "e4m3", "fp8e4m3": "e4m3", "fp8e5m2": "e5m2", "e4m3fn": "e4m3", "float8_e4m3fn": "e4m3",
                   "float8_e5m2": "e5m2"}
        return cls(parse.name("dtype", text, [d.value for d in cls], aliases))


class Arch(str, Enum):
    """Compilation targets. sm_90a is needed for wgmma and setmaxnreg."""

    SM80 = "sm_80"
    SM86 = "sm_86"
    SM89 = "sm_89"
    SM90 = "sm_90"
    SM90A = "sm_90a"

    @property
    def cc(self) -> int:
        """Compute capability as an integer: 80, 86, 89, 90."""
        return int(self.value[3:5])

    @property
    def has_wgmma(self) -> bool:
        return self is Arch.SM90A

    @classmethod
    def parse(cls, text: "str | Arch") -> "Arch":
        if isinstance(text, Arch):
            return text
        values = [a.value for a in cls]
        return cls(parse.name("arch", text, values, {v.replace("_", ""): v for v in values}))

    @classmethod
    def for_cc(cls, major: int, minor: int) -> "Arch":
        """The best target for a device of this compute capability (sm_90a on Hopper)."""
        cc = major * 10 + minor
        if cc >= 90:
            return cls.SM90A
        for arch in (cls.SM89, cls.SM86, cls.SM80):
            if cc >= arch.cc:
                return arch
        raise InvalidInput("compute capability must be at least 8.0 (Ampere)", f"{major}.{minor}")


@dataclass(frozen=True)
class Gpu:
    """One catalogue entry. Rates are dense (no sparsity), tensor-core rates with fp32 accumulation."""

    key: str
    name: str
    arch: Arch
    sm_count: int
    boost_clock_mhz: float
    tensor_flops: "tuple[tuple[str, float], ...]"  # (dtype, FLOP/s) pairs; a tuple keeps Gpu hashable
    fp32_simt_flops: float
    dram_bandwidth: float  # bytes/s
    l2_bytes: int
    smem_per_sm: int
    smem_per_block_optin: int
    regs_per_sm: int
    max_threads_per_sm: int
    max_ctas_per_sm: int
    source: str
    aliases: "tuple[str, ...]" = ()
    memory_bus_bits: int = 0
    memory_clock_mhz: float = 0.0
    power_limit_w: float = 0.0  # board power limit (TDP); 0: unknown, the model then has no power ceiling
    notes: str = ""

    def tensor_peak(self, dtype: "DType | str") -> float:
        """Dense tensor-core FLOP/s for this input dtype (fp32 accumulation)."""
        dt = DType.parse(dtype)
        for name, flops in self.tensor_flops:
            if name == dt.value:
                return flops
        raise InvalidInput(f"GPU {self.key} has no tensor-core rate for this dtype", dt.value)

    def tensor_flop_per_clock_per_sm(self, dtype: "DType | str") -> float:
        return self.tensor_peak(dtype) / (self.sm_count * self.boost_clock_mhz * 1e6)

    @property
    def dram_bytes_per_clock_per_sm(self) -> float:
        return self.dram_bandwidth / (self.sm_count * self.boost_clock_mhz * 1e6)


def _gpu_from_entry(key: str, entry: dict) -> Gpu:
    try:
        return Gpu(
            key=key,
            name=entry["name"],
            arch=Arch.parse(entry["arch"]),
            sm_count=int(entry["sm_count"]),
            boost_clock_mhz=float(entry["boost_clock_mhz"]),
            tensor_flops=tuple((DType.parse(k).value, float(v)) for k, v in entry["tensor_flops"].items()),
            fp32_simt_flops=float(entry["fp32_simt_flops"]),
            dram_bandwidth=float(entry["dram_bandwidth"]),
            l2_bytes=int(entry["l2_bytes"]),
            smem_per_sm=int(entry["smem_per_sm"]),
            smem_per_block_optin=int(entry["smem_per_block_optin"]),
            regs_per_sm=int(entry["regs_per_sm"]),
            max_threads_per_sm=int(entry.get("max_threads_per_sm", 2048)),
            max_ctas_per_sm=int(entry.get("max_ctas_per_sm", 32)),
            source=str(entry["source"]),
            aliases=tuple(str(a).lower() for a in entry.get("aliases", ())),
            memory_bus_bits=int(entry.get("memory_bus_bits", 0)),
            memory_clock_mhz=float(entry.get("memory_clock_mhz", 0.0)),
            power_limit_w=float(entry.get("power_limit_w", 0.0)),
            notes=str(entry.get("notes", "")),
        )
    except KeyError as missing:
        raise InvalidInput(f"GPU catalogue entry {key} must have field {missing.args[0]}", entry) from None


@lru_cache(maxsize=None)
def catalogue(path: "str | None" = None) -> "dict[str, Gpu]":
    """All GPUs in the catalogue, by canonical key."""
    file = Path(path) if path else CATALOGUE_PATH
    import yaml  # lazily: the runtime imports the model and must not need PyYAML
    try:
        raw = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput("GPU catalogue must be a readable YAML file", str(file), str(exc).splitlines()[0]) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), dict):
        raise InvalidInput("GPU catalogue must map 'gpus' to entries", str(file))
    return {key.lower(): _gpu_from_entry(key.lower(), entry) for key, entry in raw["gpus"].items()}


def lookup_gpu(name: "str | Gpu") -> Gpu:
    """Find a GPU by key or alias, case-insensitively ('h100' means 'h100-sxm')."""
    if isinstance(name, Gpu):
        return name
    gpus = catalogue()
    aliases = {alias: gpu.key for gpu in gpus.values() for alias in gpu.aliases}
    key = parse.name("GPU", name, gpus, aliases, listed=f"the catalogue's ({', '.join(sorted(gpus))})")
    return gpus[key]


def loosest_gpu(arch: "Arch | str") -> Gpu:
    """The most permissive catalogue GPU that runs `arch`: checks without a named GPU apply the model's rules
    (tiles, dtypes, pipeline) and only the loosest device limits."""
    arch = Arch.parse(arch)
    able = [g for g in catalogue().values() if g.arch.cc >= arch.cc and (g.arch.has_wgmma or not arch.has_wgmma)]
    if not able:
        raise InvalidInput("no catalogue GPU can run this arch", arch.value)
    return max(able, key=lambda g: (g.smem_per_block_optin, g.regs_per_sm))
