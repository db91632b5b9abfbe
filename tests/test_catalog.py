"""The GPU catalog data (src/hetplan/hardware/data/gpus.toml) and its loader: names, aliases, dense rates,
unidirectional links, completeness of every entry, user overrides and bad input."""

from __future__ import annotations

import re

import pytest

from hetplan.errors import HetplanError
from hetplan.hardware.catalog import load_catalog

REQUIRED = [
    "V100-SXM-32GB", "V100-PCIE-32GB", "T4", "A10", "A10G", "L4", "A40", "RTX-A6000", "RTX-3090", "RTX-4090",
    "L40S", "A100-SXM-40GB", "A100-SXM-80GB", "A100-PCIE-40GB", "A100-PCIE-80GB", "H100-SXM", "H100-PCIE", "H200",
    "B200", "MI300X", "A30", "RTX-A4000",
]

ALIASES = {
    "v100": "V100-SXM-32GB",
    "v100-32gb": "V100-SXM-32GB",
    "v100-sxm2-32gb": "V100-SXM-32GB",
    "Tesla V100-SXM2-32GB": "V100-SXM-32GB",
    "a6000": "RTX-A6000",
    "a6000-pcie4-48gb": "RTX-A6000",
    "3090": "RTX-3090",
    "3090-pcie4-24gb": "RTX-3090",
    "4090": "RTX-4090",
    "a30-pcie-24gb": "A30",
    "a4000": "RTX-A4000",
    "a4000-pcie4-16gb": "RTX-A4000",
    "h100": "H100-SXM",
    "A100_SXM4_80GB": "A100-SXM-80GB",
    "a100-40gb": "A100-SXM-40GB",
    "h200-141gb": "H200",
    "tesla-t4": "T4",
}

# Dense peak (TFLOP/s) per datasheet, next to the sparse/FP16-accumulate figure a careless entry would carry.
DENSE_NOT_SPARSE = {
    ("H100-SXM", "bf16"): (989.4, 1979),
    ("H100-SXM", "fp8"): (1978.9, 3958),
    ("H200", "bf16"): (989.4, 1979),
    ("H100-PCIE", "bf16"): (756, 1513),
    ("A100-SXM-80GB", "bf16"): (312, 624),
    ("A100-SXM-40GB", "fp16"): (312, 624),
    ("A10", "bf16"): (125, 250),
    ("A40", "bf16"): (149.7, 299.4),
    ("RTX-A6000", "bf16"): (154.8, 309.7),
    ("RTX-A4000", "fp16"): (76.7, 153.4),
    ("A30", "bf16"): (165, 330),
    ("L4", "bf16"): (121, 242),
    ("L40S", "bf16"): (362.05, 733),
    ("B200", "bf16"): (2250, 4500),
    ("MI300X", "bf16"): (1307.4, 2614.9),
    ("RTX-3090", "fp16"): (71, 142),  # GeForce: FP32-accumulate rate, not the FP16-accumulate 142
    ("RTX-4090", "bf16"): (165.2, 330.3),
}

# Unidirectional GPU-GPU bandwidth per GPU (GB/s), all links summed (catalog convention).
LINK_GB_PER_S = {
    "V100-SXM-32GB": 150,  # NVLink2 300 bidirectional
    "A100-SXM-80GB": 300,  # NVLink3 600
    "A100-SXM-40GB": 300,
    "H100-SXM": 450,  # NVLink4 900
    "H200": 450,
    "B200": 900,  # NVLink5 1800
    "MI300X": 448,  # Infinity Fabric 896
    "RTX-4090": 32,  # no NVLink: PCIe4 x16
    "T4": 16,  # PCIe3 x16
}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.mark.parametrize("name", REQUIRED)
def test_required_names_resolve_case_insensitively(catalog, name):
    assert name in catalog.names()
    for variant in (name, name.lower(), name.upper(), f"  {name.lower()} "):
        assert catalog.get(variant).name == name


@pytest.mark.parametrize("alias,canonical", sorted(ALIASES.items()))
def test_aliases_resolve(catalog, alias, canonical):
    assert catalog.get(alias).name == canonical


def test_aliases_are_unambiguous(catalog):
    seen: dict[str, str] = {}
    for spec in catalog.gpus.values():
        for key in (spec.name, *spec.aliases):
            norm = key.strip().lower().replace("_", "-").replace(" ", "-")
            assert seen.setdefault(norm, spec.name) == spec.name, f"{key!r} names both {seen[norm]} and {spec.name}"


def test_unknown_name_raises_with_suggestion(catalog):
    with pytest.raises(HetplanError) as info:
        catalog.get("H100-SMX")
    assert info.value.field == "gpu"
    assert "H100-SXM" in info.value.fix
    with pytest.raises(HetplanError) as info:
        catalog.get("qqqqzzzz")
    assert "hetplan catalog gpus" in info.value.fix


@pytest.mark.parametrize("name", REQUIRED)
def test_every_entry_is_complete_and_sourced(catalog, name):
    g = catalog.get(name)
    assert g.sources and all(s.strip() for s in g.sources)
    for text in (g.price_provider, g.price_date, g.price_source, g.calibration_source, g.vendor, g.architecture,
                 g.form_factor, g.gpu_link, g.host_link):
        assert text.strip()
    assert 0 < g.idle_power_w < g.tdp_w
    assert 0.2 <= g.compute_efficiency <= 1.0
    assert 10 * 2**30 < g.memory_bytes < 200 * 2**30
    assert 1e11 < g.hbm_bandwidth_bytes_per_s < 1e13
    assert g.host_link_bandwidth_bytes_per_s <= 128e9
    assert "fp16" in g.dense_flops_per_s and "fp32" in g.dense_flops_per_s
    # fp32 is the CUDA-core rate: far below the tensor rate
    assert g.dense_flops_per_s["fp32"] < g.dense_flops_per_s["fp16"]
    assert 0 < g.price_usd_per_hour < 20


def test_catalog_is_dated(catalog):
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", catalog.date)


@pytest.mark.parametrize("key", sorted(DENSE_NOT_SPARSE))
def test_dense_not_sparse(catalog, key):
    name, dtype = key
    dense, wrong = DENSE_NOT_SPARSE[key]
    got = catalog.get(name).peak_flops_per_s(dtype)
    assert got == pytest.approx(dense * 1e12, rel=1e-6)
    assert got != pytest.approx(wrong * 1e12, rel=0.01)


def test_h100_bf16_is_dense(catalog):
    assert catalog.get("H100-SXM").dense_flops_per_s["bf16"] == pytest.approx(989.4e12)


@pytest.mark.parametrize("name", ["V100-SXM-32GB", "V100-PCIE-32GB", "T4"])
def test_no_bf16_before_ampere(catalog, name):
    g = catalog.get(name)
    assert "bf16" not in g.dense_flops_per_s
    with pytest.raises(HetplanError) as info:
        g.peak_flops_per_s("bf16")
    assert "fp16" in info.value.fix


@pytest.mark.parametrize("name,gb_per_s", sorted(LINK_GB_PER_S.items()))
def test_links_are_unidirectional(catalog, name, gb_per_s):
    assert catalog.get(name).gpu_link_bandwidth_bytes_per_s == pytest.approx(gb_per_s * 1e9)


def test_memory_is_driver_total(catalog):
    # nvidia-smi totals (MiB): not the marketing GB
    assert catalog.get("H100-SXM").memory_bytes == 81559 * 2**20
    assert catalog.get("A100-SXM-80GB").memory_bytes == 80 * 2**30
    assert catalog.get("B200").memory_bytes == 183359 * 2**20
    assert catalog.get("GB200").memory_bytes == 189471 * 2**20  # was the datasheet 186e9 B (false "does not fit")
    assert catalog.get("T4").memory_bytes == 15360 * 2**20


def test_perseus_idle_powers(catalog):
    assert catalog.get("A100-SXM-80GB").idle_power_w == pytest.approx(83.64)
    assert catalog.get("A40").idle_power_w == pytest.approx(70.38)


NEW_GPU = """
[gpus.h100-sxm]
price_usd_per_hour = 1.5
price_provider = "my reserved contract"
price_date = "2026-11"

[gpus.TOY-GPU]
aliases = ["toy"]
vendor = "acme"
architecture = "Toy"
form_factor = "PCIe"
memory_gib = 12
hbm_bandwidth_gb_per_s = 400
dense_tflops = { bf16 = 50, fp16 = 50, fp32 = 10 }
gpu_link = "PCIe4 x16"
gpu_link_bandwidth_gb_per_s = 32
host_link = "PCIe4 x16"
host_link_bandwidth_gb_per_s = 32
tdp_w = 200
idle_power_w = 40
price_usd_per_hour = 0.3
price_provider = "lab"
price_date = "2026"
price_source = "test"
compute_efficiency = 0.5
calibration_source = "test"
sources = ["test"]
"""


def test_user_file_overrides_price_and_adds_gpu(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(NEW_GPU)
    cat = load_catalog(path)
    h100 = cat.get("H100-SXM")
    assert h100.price_usd_per_hour == 1.5
    assert h100.price_provider == "my reserved contract"
    assert h100.dense_flops_per_s["bf16"] == pytest.approx(989.4e12)  # untouched fields kept
    toy = cat.get("toy")
    assert toy.name == "TOY-GPU"
    assert toy.memory_bytes == 12 * 2**30
    assert toy.peak_flops_per_s("bf16") == pytest.approx(50e12)
    assert set(REQUIRED) <= set(cat.names())
    # the package catalog itself is unchanged
    assert load_catalog().get("H100-SXM").price_usd_per_hour == pytest.approx(3.84)
    with pytest.raises(HetplanError):
        load_catalog().get("toy")


def test_malformed_toml_names_the_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[gpus.H100-SXM]\nprice_usd_per_hour = \n')
    with pytest.raises(HetplanError) as info:
        load_catalog(path)
    assert "line 2" in str(info.value)
    assert str(path) in str(info.value)


def test_bad_field_names_the_field(tmp_path):
    path = tmp_path / "neg.toml"
    path.write_text("[gpus.A10]\nprice_usd_per_hour = -1\n")
    with pytest.raises(HetplanError) as info:
        load_catalog(path)
    assert info.value.field == "gpus.A10.price_usd_per_hour"


@pytest.mark.parametrize("entry, field, words", [
    # named by the file's field, not the SI one no file has (it said gpus.A10.memory_bytes)
    ("memory_gib = 0", "gpus.A10.memory_gib", "in bytes: the file's memory_gib x 2^30"),
    ("dense_tflops = { bf16 = 0 }", "gpus.A10.dense_tflops.bf16", "in FLOP/s"),
    ("hbm_bandwidth_gb_per_s = 0", "gpus.A10.hbm_bandwidth_gb_per_s", "in bytes/s"),
])
def test_a_field_in_file_units_is_named_as_the_file_gives_it(tmp_path, entry, field, words):
    path = tmp_path / "bad.toml"
    path.write_text(f"[gpus.A10]\n{entry}\n")
    with pytest.raises(HetplanError) as info:
        load_catalog(path)
    assert info.value.field == field and words in info.value.message


@pytest.mark.parametrize("loader, text, field", [
    ("load_catalog", "[gpu.H100-SXM]\nmemory_gib = 10\n", "--catalog:gpu"),  # the typo priced the shipped 80 GB
    ("load_catalog", "[nodes.my-node]\ngpus_per_node = 4\n", "--catalog:nodes"),
    ("load_nodes", "[gpus.H100-SXM]\nmemory_gib = 10\n", "--nodes:gpus"),
])
def test_a_user_file_section_of_another_name_is_refused(tmp_path, loader, text, field):
    """Only [gpus.NAME] (--catalog) / [nodes.NAME] (--nodes) and [meta] are read: any other section was ignored
    without a word."""
    from hetplan.hardware import catalog

    path = tmp_path / "user.toml"
    path.write_text(text)
    with pytest.raises(HetplanError) as info:
        getattr(catalog, loader)(path)
    assert info.value.field == field and "unknown section" in info.value.message


def test_missing_user_file(tmp_path):
    with pytest.raises(HetplanError) as info:
        load_catalog(tmp_path / "nope.toml")
    assert info.value.field == "--catalog"


# ------------------------------------------------------------------------------------------------ nodes


def test_node_presets_are_sourced_and_name_catalog_gpus():
    from hetplan.hardware.catalog import NETWORK_KINDS, load_nodes

    cat, nodes = load_catalog(), load_nodes()
    for n in nodes.nodes.values():
        assert cat.get(n.gpu).name == n.gpu
        assert n.sources and n.date and n.network in NETWORK_KINDS
    assert nodes.get("DGX-H100").inter_node_bandwidth_bytes_per_s == pytest.approx(8 * 400e9 / 8)
    assert nodes.get("p4d.24xlarge").inter_node_bandwidth_bytes_per_s == pytest.approx(4 * 100e9 / 8)
    nvl = nodes.get("nvl72")
    assert nvl.gpus_per_node == 72 and nvl.inter_node_bandwidth_bytes_per_s == pytest.approx(72 * 50e9)
    # every GPU type that has a reference node points at a node of its own type
    for name in ("A100-SXM-80GB", "A100-SXM-40GB", "H100-SXM", "H200", "B200", "GB200"):
        assert nodes.reference(cat.get(name)).gpu in (name, "A100-SXM-80GB")
    assert nodes.reference(cat.get("A10G")) is None
    with pytest.raises(HetplanError) as info:
        nodes.get("dgx-h1000")
    assert info.value.field == "node" and "dgx-h100" in str(info.value)


def test_pools_take_their_node_or_the_reference_node():
    from pydantic import ValidationError

    from hetplan.plan import DEFAULT_INTER_NODE_BANDWIDTH_BYTES_PER_S, GPUPool

    h = GPUPool(gpu="h100", count=16)  # reference node: DGX H100, 8 x 400 Gb/s
    assert (h.node, h.gpus_per_node, h.inter_node_bandwidth_bytes_per_s, h.network) == ("dgx-h100", 8, 400e9,
                                                                                           "infiniband")
    p4d = GPUPool(gpu="A100-SXM-40GB", count=16, node="p4d")
    assert (p4d.node, p4d.inter_node_bandwidth_bytes_per_s, p4d.network) == ("aws-p4d", 50e9, "efa")
    own = GPUPool(gpu="H100-SXM", count=16, inter_node_bandwidth_bytes_per_s=1e9, network="ethernet")
    assert own.inter_node_bandwidth_bytes_per_s == 1e9 and own.network == "ethernet"  # given fields win
    a10g = GPUPool(gpu="A10G", count=8)  # no reference node: the generic defaults
    assert a10g.node is None and a10g.inter_node_bandwidth_bytes_per_s == DEFAULT_INTER_NODE_BANDWIDTH_BYTES_PER_S
    with pytest.raises(ValidationError, match="holds A100-SXM-40GB GPUs, not H100-SXM"):
        GPUPool(gpu="H100-SXM", count=8, node="aws-p4d")
    with pytest.raises(ValidationError, match="did you mean dgx-h100"):
        GPUPool(gpu="H100-SXM", count=8, node="dgx-h1000")


def test_new_gpu_entries():
    cat = load_catalog()
    gb = cat.get("GB200")
    assert gb.peak_flops_per_s("bf16") == pytest.approx(2500e12) and gb.peak_flops_per_s("fp8") == pytest.approx(5000e12)
    capped = cat.get("h100-500w")
    assert capped.tdp_w == 500 and capped.name != "H100-SXM"
    assert capped.hbm_bandwidth_bytes_per_s < cat.get("H100-SXM").hbm_bandwidth_bytes_per_s
    for name in ("H100-SXM", "H200", "B200", "GB200", "H100-SXM-96GB-500W"):
        assert cat.get(name).peak_flops_per_s("fp8") == pytest.approx(2 * cat.get(name).peak_flops_per_s("bf16"), rel=1e-3)


@pytest.mark.parametrize("text, field", [("nodes = 3\n", "--nodes"), ("[nodes]\nmy-node = 3\n", "nodes.my-node")])
def test_user_node_file_of_the_wrong_shape_names_the_field(tmp_path, text, field):
    """A user node file goes through the same overlay checks as a user GPU catalog (it once raised AttributeError)."""
    from hetplan.hardware.catalog import load_nodes

    path = tmp_path / "nodes.toml"
    path.write_text(text)
    with pytest.raises(HetplanError) as exc:
        load_nodes(path)
    assert exc.value.field == field


@pytest.mark.parametrize("smi_name, gpu", [("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
                                           ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"), ("Tesla V100-SXM2-32GB", "V100-SXM-32GB"),
                                           ("AMD Instinct MI300X", "MI300X")])
def test_nvidia_smi_product_names_resolve(smi_name, gpu):
    """The name nvidia-smi (rocm-smi) prints, vendor word included, is the GPU's."""
    assert load_catalog().get(smi_name).name == gpu
