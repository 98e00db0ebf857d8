"""The GPU catalogue: every required GPU, every field, cited, aliases, and driver-name matching."""
from __future__ import annotations

import dataclasses

import pytest

from gemmgen.model.arch import Gpu, catalogue, lookup_gpu
from gemmgen.runtime.detect import Detected, detect_gpu, match_name
from gemmgen.model.errors import InvalidInput

REQUIRED = ["h100-sxm", "h100-pcie", "h200", "a100-sxm", "a100-pcie", "l40s", "l20", "rtx4090", "rtx3090"]


def test_catalogue_holds_every_required_gpu():
    assert set(REQUIRED) <= set(catalogue())


@pytest.mark.parametrize("key", REQUIRED)
def test_every_entry_fills_every_field_with_a_plausible_value_and_a_source(key):
    gpu = catalogue()[key]
    for f in dataclasses.fields(Gpu):
        if f.name in ("aliases", "notes"):
            continue
        assert getattr(gpu, f.name) not in (None, "", 0, 0.0, ()), f.name
    assert len(gpu.source) > 20
    assert 40 <= gpu.sm_count <= 200
    assert gpu.tensor_peak("bf16") == gpu.tensor_peak("f16")
    assert gpu.fp32_simt_flops < gpu.tensor_peak("bf16")
    assert gpu.smem_per_block_optin < gpu.smem_per_sm
    assert 150 <= gpu.power_limit_w <= 1000   # board power (the model's power ceiling divides energy by it)
    # The driver-style memory clock and bus width give the datasheet bandwidth within a few percent.
    derived = 2 * gpu.memory_clock_mhz * 1e6 * gpu.memory_bus_bits / 8
    assert derived == pytest.approx(gpu.dram_bandwidth, rel=0.05)


@pytest.mark.parametrize("key,per_sm", [("h100-sxm", 4096), ("h200", 4096), ("a100-sxm", 2048), ("rtx3090", 512),
                                        ("rtx4090", 512)])
def test_tensor_rate_per_sm_per_clock_matches_the_architecture(key, per_sm):
    assert lookup_gpu(key).tensor_flop_per_clock_per_sm("bf16") == pytest.approx(per_sm, rel=0.01)


@pytest.mark.parametrize("name,key", [("h100", "h100-sxm"), ("H100", "h100-sxm"), ("H100-PCIE", "h100-pcie"),
                                      ("a100", "a100-sxm"), ("A100-pcie", "a100-pcie"), ("L40S", "l40s"),
                                      ("l20", "l20"), ("RTX4090", "rtx4090"), ("rtx3090", "rtx3090"),
                                      ("h200", "h200")])
def test_names_and_aliases_are_case_insensitive(name, key):
    assert lookup_gpu(name).key == key


@pytest.mark.parametrize("name", [" h100-sxm ", "h100\n", "", "ｈ100"])
def test_names_are_not_loosely_written(name):
    """Issue 24: names go through the one name parser: no surrounding spaces, no empty string, ASCII only."""
    with pytest.raises(InvalidInput, match="GPU must be one of"):
        lookup_gpu(name)


def test_unknown_gpu_is_a_one_line_user_error_listing_the_catalogue():
    with pytest.raises(InvalidInput) as info:
        lookup_gpu("v100")
    assert "h100-sxm" in str(info.value) and "\n" not in str(info.value)


def test_aliases_are_unique_across_entries():
    names = [k for k in catalogue()] + [a for g in catalogue().values() for a in g.aliases]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("device_name,sms,key", [
    ("NVIDIA H100 80GB HBM3", 132, "h100-sxm"), ("NVIDIA H100 PCIe", 114, "h100-pcie"), ("NVIDIA H200", 132, "h200"),
    ("NVIDIA A100-SXM4-80GB", 108, "a100-sxm"), ("NVIDIA A100 80GB PCIe", 108, "a100-pcie"),
    ("NVIDIA L40S", 142, "l40s"), ("NVIDIA L20", 92, "l20"), ("NVIDIA GeForce RTX 4090", 128, "rtx4090"),
    ("NVIDIA GeForce RTX 3090", 82, "rtx3090")])
def test_driver_device_names_match_their_catalogue_entry(device_name, sms, key):
    assert match_name(device_name, sms).key == key


@pytest.mark.parametrize("device_name,sms", [("NVIDIA GeForce RTX 3090 Ti", 84), ("NVIDIA H100 NVL", 132),
                                             ("NVIDIA H100 80GB HBM3", 114), ("Tesla V100-SXM2-16GB", 80)])
def test_variants_and_unknown_devices_do_not_match(device_name, sms):
    assert match_name(device_name, sms) is None


def test_detection_without_a_driver_says_so_plainly(monkeypatch):
    import gemmgen.runtime.detect as detect

    monkeypatch.setattr(detect, "read_props", lambda device=0: ({}, "no CUDA driver found (libcuda.so not loadable)"))
    found = detect_gpu()
    assert found == Detected(None, "no CUDA driver found (libcuda.so not loadable)", {})


def test_detection_matches_reported_properties_to_the_catalogue(monkeypatch):
    import gemmgen.runtime.detect as detect

    props = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "cc_major": 9, "cc_minor": 0}
    monkeypatch.setattr(detect, "read_props", lambda device=0: (props, ""))
    found = detect_gpu()
    assert found.gpu.key == "h100-sxm" and "h100-sxm" in found.reason and found.props["sm_count"] == 132


def test_detection_never_raises_on_this_machine():
    found = detect_gpu()
    assert isinstance(found, Detected)
    assert found.gpu is not None or found.reason


@pytest.mark.gpu
def test_detection_on_a_gpu_reads_the_driver_and_matches_the_catalogue():
    found = detect_gpu()
    assert found.props["sm_count"] > 0 and found.props["l2_bytes"] > 0
    assert found.gpu is not None, found.reason
    assert found.props["sm_count"] == found.gpu.sm_count
    assert found.props["smem_per_block_optin"] == found.gpu.smem_per_block_optin


def test_dtype_names_users_type_are_understood_and_others_refused_by_name():
    from gemmgen.model.arch import DType
    from gemmgen.model.errors import InvalidInput

    # tf32 is fp32 inputs' default math, and torch spells its fp8 types float8_e4m3fn / float8_e5m2.
    assert DType.parse("tf32") is DType.F32 and DType.parse("bfloat16") is DType.BF16
    assert DType.parse("float8_e4m3fn") is DType.E4M3 and DType.parse("float8_e5m2") is DType.E5M2
    with pytest.raises(InvalidInput, match="dtype must be one of"):
        DType.parse("fp64")
