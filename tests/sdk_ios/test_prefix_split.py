"""--coreml: the frozen prefix goes to Core ML, the static library holds the rest.
On the host the PyTorch prefix stands in for Core ML, fed exactly as the Swift
layer feeds it (CoreMLPrefix.stepInputs: compiled inputs by name, from the
prefix outputs first, else the caller's inputs)."""
import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.runtime.bundle import read_bundle
from pockengine.platforms.coreml import mlpackage_io, mlpackage_weights
from pockengine.platforms.ios import build_ios
from pockengine.platforms.macho import read_archive, read_fat, read_macho

from ios_models import tiny_spec

prefix_mod = pytest.importorskip("pockengine.passes.prefix", reason="the frozen-prefix split is not merged yet")
from pockengine.backends.prefix_torch import PrefixModule  # noqa: E402


def swift_step_inputs(m: dict, inputs: list, prefix_run) -> list:
    """PockTrainer.step's inputs as CoreMLPrefix.stepInputs builds them."""
    by_name = {io["name"]: x for io, x in zip(m["prefix"]["inputs"], inputs)}
    outs = prefix_run(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    by_name.update({io["name"]: o for io, o in zip(m["prefix"]["outputs"], outs)})
    return [by_name[io["name"]] for io in m["inputs"]]


@pytest.fixture(scope="module")
def coreml_build(tmp_path_factory):
    spec = tiny_spec()
    spec["update"] = {"fc.*": 1.0}  # the embedding is frozen: its lookup is the prefix
    prog = pe.compile(**spec)
    out = tmp_path_factory.mktemp("ios-coreml")
    files = build_ios(prog, out, coreml=True, spec=spec)
    return {"prog": prog, "spec": spec, **files}


def test_bundle_records_the_split_and_the_mlpackage(coreml_build):
    m = read_bundle(coreml_build["bundle"])
    p = m["prefix"]
    assert p["runtime"] == "coreml" and p["coreml"]["fp16"] is True
    package = coreml_build["bundle"] / p["coreml"]["path"]
    io = mlpackage_io(package)
    assert [i["name"] for i in io["inputs"]] == [i["name"] for i in p["inputs"]]
    assert [i["shape"] for i in io["inputs"]] == [[2, 4]] and io["inputs"][0]["dtype"] == "int32"
    assert [(o["name"], o["shape"]) for o in io["outputs"]] == [(o["name"], o["shape"]) for o in p["outputs"]]
    # the compiled step takes the prefix's outputs instead of the tokens
    assert {o["name"] for o in p["outputs"]} <= {i["name"] for i in m["inputs"]}
    (table,) = [w for w in mlpackage_weights(package).values() if w.shape == (20, 8)]
    emb = coreml_build["spec"]["model"].emb.weight.detach().numpy()
    np.testing.assert_array_equal(table, emb.astype(np.float16))


def test_static_library_holds_the_suffix(coreml_build):
    lib = coreml_build["xcframework"] / "ios-arm64" / "libpock_tiny_tagger.a"
    ((_, archive),) = read_fat(lib.read_bytes())
    assert any(name.startswith("tiny_tagger-") for name, _ in read_archive(archive))
    assert "pock_step" in set().union(*(read_macho(o).exported for _, o in read_archive(archive)))


def test_prefix_then_step_on_host_equals_the_whole_step(coreml_build):
    m = read_bundle(coreml_build["bundle"])
    prefix, suffix = prefix_mod.split_prefix(coreml_build["prog"])
    suffix.source()
    assert suffix.hash == m["hash"]  # the same suffix the XCFramework holds
    whole = pe.compile(**{**tiny_spec(), "update": {"fc.*": 1.0}}).build_cpu()
    step = suffix.build_cpu()
    try:
        step.load(coreml_build["bundle"] / m["weights"])  # the bundle's weights, as pock_open reads them
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x, y = torch.randint(0, 20, (2, 4), generator=g), torch.randint(0, 20, (2, 4), generator=g)
            with torch.no_grad():
                ins = swift_step_inputs(m, [x], PrefixModule(prefix))
            assert step.step(tuple(ins), (y,)) == pytest.approx(whole.step((x,), (y,)), rel=1e-5)
        np.testing.assert_allclose(step.get_tensor("fc.weight"), whole.get_tensor("fc.weight"), rtol=1e-5, atol=1e-6)
    finally:
        step.close()
        whole.close()


def test_coreml_build_selects_the_registered_backend(coreml_build, tmp_path):
    """build_ios(coreml=True) and backends=["coreml", "cpu"] reach the prefix through the
    registry: a record registered under "coreml" is the one whose split and export run."""
    from dataclasses import replace

    from pockengine.backends import get, register
    original = get("coreml")
    calls = []

    def split(prog):
        calls.append("split")
        return original.split(prog)

    def export(prefix, bundle_dir, target=None, **kw):
        calls.append(("export", target, kw["name"]))
        return original.export(prefix, bundle_dir, target, **kw)

    register(replace(original, split=split, export=export), replace=True)
    try:
        for i, kw in enumerate([{"coreml": True}, {"backends": ["coreml", "cpu"]}]):
            files = build_ios(coreml_build["prog"], tmp_path / str(i), **kw)
            assert read_bundle(files["bundle"])["prefix"]["runtime"] == "coreml"
    finally:
        register(original, replace=True)
    assert calls == [*["split", ("export", "ios", "tiny_tagger")] * 2]
