"""Bundles are checked before anything launches: schema, cubin sha256 and ELF architecture, launches recomputed
from the kernel's configuration; each refusal names the manifest field. A folder of several bundles loads one
by name."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import gemmgen
from gemmgen import Arch, Kernel, Problem, TileConfig
from gemmgen.model.errors import InvalidInput
from gemmgen.runtime.bundle import cubin_sm, runs_on
from gemmgen.runtime.loader import read_bundle
from gemmgen.tune.export import export_bundle

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    try:
        from gemmgen.codegen.nvrtc import compile_kernel
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {exc}")
    folder = tmp_path_factory.mktemp("bundle")
    problem = Problem.create(1000, 512, 256)
    # Not persistent: its grid is fixed by the tiles, so an edited grid must be refused (a persistent grid may take
    # any number of whole clusters).
    config = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64",
                                   "mma": "64x128x16", "stages": 4, "warp_specialized": True, "persistent": False})
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    exported = export_bundle(folder, kernel, problem, compile_kernel(kernel), measured=None, verification=None,
                             environment={})
    return exported


def tampered(tmp_path, bundle, edit=None, cubin=None):
    folder = tmp_path / "b"
    shutil.copytree(bundle.manifest_path.parent, folder)
    path = folder / bundle.manifest_path.name
    manifest = json.loads(path.read_text())
    if edit:
        edit(manifest)
    path.write_text(json.dumps(manifest))
    if cubin is not None:
        (folder / manifest["cubin"]).write_bytes(cubin)
    return folder


def test_an_exported_bundle_passes_and_says_its_architecture(bundle):
    manifest, cubin, _ = read_bundle(bundle.manifest_path)
    assert cubin_sm(cubin) == 90 and manifest["cubin_sha256"]
    assert runs_on("sm_90a", (9, 0)) and not runs_on("sm_90a", (10, 0)) and not runs_on("sm_90a", (8, 0))
    assert runs_on("sm_80", (8, 6)) and not runs_on("sm_80", (9, 0))


@pytest.mark.parametrize("edit,field", [
    (lambda m: m["launches"][0].update(block=[2048, 1, 1]), "launches[0].block"),
    (lambda m: m["launches"][0].update(dynamic_smem=m["launches"][0]["dynamic_smem"] + 1024), "launches[0].dynamic_smem"),
    (lambda m: m["launches"][0].update(grid=[m["launches"][0]["grid"][0] * 2 + 2, 1, 1]), "launches[0].grid"),
    (lambda m: m.update(workspace_bytes=-1), "workspace_bytes"),
    (lambda m: m.update(arch="sm_80"), "arch"),
    (lambda m: m.update(cubin_sha256="0" * 64), "cubin_sha256"),
    (lambda m: m.pop("cubin_sha256"), "cubin_sha256"),
    (lambda m: m["launches"][0]["params"].reverse(), "launches[0].params"),
    (lambda m: m["config"].update(stages=m["config"]["stages"] - 1), "name"),
])
def test_a_manifest_that_disagrees_with_its_kernel_is_refused_naming_the_field(tmp_path, bundle, edit, field):
    with pytest.raises(InvalidInput, match=f"manifest field {field.replace('[', '.').replace(']', '.')}"):
        gemmgen.load(tampered(tmp_path, bundle, edit))


@pytest.mark.parametrize("edit,field", [
    (lambda m: m["operands"].update(align_a=1), "operands.align_a"),
    (lambda m: m["operands"].update(a_layout="col"), "operands.a_layout"),
    (lambda m: m["operands"].update(bias=True), "operands.bias"),
    (lambda m: m["operands"].pop("c_dtype"), "operands.c_dtype"),
    (lambda m: m.update(operands="bf16"), "operands"),
])
def test_an_operands_block_that_is_not_the_kernels_is_refused_naming_the_field(tmp_path, bundle, edit, field):
    # Regression: the manifest's operands (dtypes, layouts, alignment, epilogue: what a launcher in another language
    # reads to pass its arrays) were never checked, so any edit of them loaded, e.g. align_a 1 beside a kernel whose
    # vector loads assume 8.
    with pytest.raises(InvalidInput, match=f"manifest field {re.escape(field)}"):
        gemmgen.load(tampered(tmp_path, bundle, edit))


@pytest.mark.parametrize("key", ["name", "kind", "tensor"])
@pytest.mark.parametrize("value", [[], {"a": 1}])
def test_a_parameter_field_that_is_not_text_is_refused_naming_it(tmp_path, bundle, key, value):
    # Regression (found by mutating every field of a manifest): a list or mapping as a parameter's name, kind or
    # tensor ended gemmgen.load in a bare TypeError ("unhashable type: 'list'").
    with pytest.raises(InvalidInput, match=rf"manifest field launches\[0\]\.params\[0\]\.{key} must be text"):
        gemmgen.load(tampered(tmp_path, bundle, lambda m: m["launches"][0]["params"][0].update({key: value})))


def test_a_cubin_that_is_not_the_manifests_is_refused(tmp_path, bundle):
    original = bundle.cubin_path.read_bytes()
    with pytest.raises(InvalidInput, match="cubin_sha256"):
        gemmgen.load(tampered(tmp_path, bundle, cubin=original[:-16] + bytes(16)))
    with pytest.raises(InvalidInput, match="ELF"):
        read_bundle(tampered(tmp_path / "ptx", bundle, lambda m: m.update(cubin_sha256=__import__("hashlib").sha256(
            b"// PTX text").hexdigest()), cubin=b"// PTX text"))


def test_a_folder_of_several_bundles_loads_the_named_one(tmp_path, bundle):
    folder = tampered(tmp_path, bundle)
    other = json.loads(bundle.manifest_path.read_text())
    other["name"] = "other_kernel"
    (folder / "other_kernel.json").write_text(json.dumps(other))
    with pytest.raises(InvalidInput, match="exactly one"):
        gemmgen.load(folder)
    assert gemmgen.load(folder, name=bundle.manifest["name"]).name == bundle.manifest["name"]
    with pytest.raises(InvalidInput, match="name must be one of"):
        gemmgen.load(folder, name="missing")


def _param(manifest, name):
    return next(p for p in manifest["launches"][0]["params"] if p["name"] == name)


@pytest.mark.parametrize("edit,key", [
    (lambda m: _param(m, "M").update(value=2000), "value"),             # a launch scalar past the arrays
    (lambda m: _param(m, "alpha").update(value=2.0), "value"),
    (lambda m: _param(m, "tmA").update(box=[64, 64]), "box"),           # a tensor map's box, dims, strides
    (lambda m: _param(m, "tmB").update(dims=[1024, 256]), "dims"),
    (lambda m: m["problem"].update(K=512), "dims"),                     # the problem edited, the launches not
])
def test_a_launch_value_that_disagrees_with_the_manifests_problem_is_refused(tmp_path, bundle, edit, key):
    # Regression: only names, kinds, tensors and offsets were compared, so a manifest whose scalar M or tensor-map
    # box had been edited (or whose problem.K was, beside the old launches) loaded, and the loader launched the
    # bundle's own problem with the stale values: the kernel ran over other bounds than the arrays'.
    with pytest.raises(InvalidInput, match=rf"manifest field launches\[0\]\.params\[\d+\]\.{key} must be what"):
        gemmgen.load(tampered(tmp_path, bundle, edit))


def test_a_tensor_map_written_before_l2_promotion_existed_still_loads(tmp_path, bundle):
    def legacy(manifest):
        for p in manifest["launches"][0]["params"]:
            p.pop("l2_promotion", None)

    assert gemmgen.load(tampered(tmp_path, bundle, legacy)).name == bundle.manifest["name"]


def test_a_parameter_list_that_is_not_the_cubins_is_refused(tmp_path, bundle):
    # Parameters are passed by position: a manifest one short of its cubin's list (here tmAe dropped, as an edit or a
    # manifest beside another cubin would) shifts every later argument. The cubin's .nv.info notes say what it takes.
    def drop_tm_edge(manifest):
        manifest["launches"][0]["params"] = [p for p in manifest["launches"][0]["params"] if p["name"] != "tmAe"]

    with pytest.raises(InvalidInput, match=r"launches\[0\]\.params must be the parameters the cubin's kernel takes"):
        gemmgen.load(tampered(tmp_path, bundle, drop_tm_edge))
    with pytest.raises(InvalidInput, match=r"launches\[0\]\.entry must be a kernel of the cubin"):
        gemmgen.load(tampered(tmp_path / "entry", bundle, lambda m: m["launches"][0].update(entry="other")))


def test_a_bundle_exported_before_the_edge_maps_loads_and_keeps_its_parameters(tmp_path, monkeypatch):
    # Regression: docs/architecture.md promises that bundles exported before the edge maps (tmAe, tmBe) are served
    # with the parameter list they shipped with, but verify refused them ("params must be the kernel's parameters
    # in order"), so gemmgen.load never reached that path. Such a bundle is built here with the edge maps off.
    from gemmgen.codegen.nvrtc import compile_kernel
    from gemmgen.families.sm90_wgmma import context, launch
    from gemmgen.runtime.serve import manifest_for, problem_from_shapes

    problem = Problem.create(1000, 512, 256, b="col")
    config = TileConfig.from_dict({"family": "sm90_wgmma", "cta": "128x128x64", "warp": "64x128x64",
                                   "mma": "64x128x16", "stages": 4, "warp_specialized": True, "persistent": True})
    kernel = Kernel(Arch.SM90A, problem.operands, config)
    assert launch.edge_boxes(kernel) == (True, True)
    with monkeypatch.context() as before:
        for module in (context, launch):
            before.setattr(module, "edge_boxes", lambda kernel: (False, False))
        exported = export_bundle(tmp_path, kernel, problem, compile_kernel(kernel), measured=None, verification=None,
                                 environment={})
    names = [p["name"] for p in exported.manifest["launches"][0]["params"]]
    assert "tmAe" not in names and "tmBe" not in names
    loaded = gemmgen.load(tmp_path)
    other = problem_from_shapes(problem, (300, 256), (256, 520), (300, 520), (256, 1), (1, 256), (520, 1))
    assert [p["name"] for p in manifest_for(loaded.manifest, loaded.kernel, other)["launches"][0]["params"]] == names


def test_a_cubin_whose_kernel_notes_are_cut_short_is_read_without_raising(bundle):
    # A cubin is data too (its sha256 is the manifest's word): a .nv.info section whose size ends inside a parameter
    # record raised struct.error out of the parameter check; the cut record is skipped.
    import struct

    from gemmgen.runtime.bundle import cubin_params

    cubin = bytearray(bundle.cubin_path.read_bytes())
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    names = struct.unpack_from("<IIQQQQ", cubin, shoff + shstrndx * shentsize)[4]
    for i in range(shnum):
        header = shoff + i * shentsize
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", cubin, header)
        if not cubin[names + name:].startswith(b".nv.info."):
            continue
        pos = 0
        while True:   # the first parameter record: cut the section 6 bytes into its 12-byte payload
            form, attribute, value = struct.unpack_from("<BBH", cubin, offset + pos)
            pos += 4
            if form == 4 and attribute == 0x17:
                break
            pos += value if form == 4 else 0
        struct.pack_into("<Q", cubin, header + 32, pos + 6)
    params = cubin_params(bytes(cubin))
    assert params and all(len(sizes) < 15 for sizes in params.values())


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "lab-data").rglob("*.json")
                                        if '"gemmgen-manifest/1"' in p.read_text()))
def test_the_manifests_exported_on_the_h100_before_the_edge_maps_still_verify(path):
    # Regression: five of the seven winners' manifests kept in docs/lab-data (exported 2026-11-25/26, before the edge
    # maps) were refused as "params must be the kernel's parameters in order" since 6f6267c.
    from gemmgen.runtime.bundle import check_launches, check_schema

    manifest = json.loads((ROOT / path).read_text())
    check_schema(manifest)
    check_launches(manifest)
