"""The Hexagon HTP backend: the frozen prefix compiled to a QNN context binary
for a SoC and run on the QNN HTP simulator before the compiled suffix step.

Tolerance: the HTP runs the float prefix in fp16, so prefix outputs carry a
relative error of about 2^-11 per rounding; we allow 2e-3 relative (of the
output's max magnitude) on prefix outputs and 2e-3 relative on step losses
against the all-CPU (fp32) step."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pockengine as pe
from pockengine.backends.htp import binary_info, compile_prefix, export_htp_prefix, submit_ai_hub
from pockengine.backends.prefix_torch import PrefixModule
from pockengine.passes.prefix import split_prefix

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "passes"))
from test_prefix import _case  # noqa: E402

pytest.importorskip("onnxruntime_qnn")
FP16_RTOL = 2e-3


@pytest.fixture(scope="module", params=["keyboard", "mbv2"])
def case(request):
    model, prog, data = _case(request.param)
    prefix, suffix = split_prefix(prog)
    return request.param, prog, data, prefix


def test_context_binary_is_for_sm8550_v73(case):
    name, prog, data, prefix = case
    built = compile_prefix(prefix, "sm8550", "fp16")
    assert binary_info(built["binary"]) == {"soc": "SM8550", "htp_arch": 73}
    assert (built["soc"], built["htp_arch"]) == ("SM8550", 73)
    other = compile_prefix(prefix, "sm8650", "fp16")
    assert binary_info(other["binary"]) == {"soc": "SM8650", "htp_arch": 75}


def test_step_with_htp_prefix_matches_the_cpu_step(case, tmp_path):
    name, prog, data, prefix = case
    htp = prog.build(backends=["htp", "cpu"], out_dir=tmp_path)
    cpu = prog.build_cpu()
    # the prefix runs on the simulator and agrees with PyTorch to fp16 precision
    (x,), _ = data[0]
    got = htp.prefix_outputs((x,))[0]
    with torch.no_grad():
        want = PrefixModule(prefix)(x).numpy()
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < FP16_RTOL, err
    assert err > 0  # it really ran in reduced precision, not in PyTorch
    for i in range(3):
        np.testing.assert_allclose(htp.step(*data[i]), cpu.step(*data[i]), rtol=FP16_RTOL)
    np.testing.assert_allclose(htp.forward(data[1][0]), cpu.forward(data[1][0]), rtol=5e-2, atol=5e-3)
    m = htp.prefix_manifest
    assert (m["soc"], m["htp_arch"], m["qnn_soc_model"], m["precision"]) == ("sm8550", 73, 43, "fp16")
    for f in m["files"].values():
        assert (tmp_path / f).is_file()
    assert m["outputs"] == prefix.outputs
    htp.close()


def test_loss_falls_over_50_steps_with_the_htp_prefix(case):
    name, prog, data, prefix = case
    trainer = prog.build(backends=["htp", "cpu"])
    losses = [trainer.step(*data[i % len(data)]) for i in range(50)]
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:3]), losses
    assert trainer.step_count == 50


def test_int8_qdq_prefix_runs_on_the_simulator(tmp_path):
    model, prog, data = _case("mbv2")
    prefix, _ = split_prefix(prog)
    calib = [inputs for inputs, _ in data]
    m = export_htp_prefix(prefix, tmp_path, "sm8550", "int8", calibration=calib)
    assert m["precision"] == "int8" and binary_info(tmp_path / m["files"]["context_binary"])["htp_arch"] == 73
    from pockengine.backends.htp import HtpRunner
    built = compile_prefix(prefix, "sm8550", "int8", calibration=calib)
    got = HtpRunner(prefix, built)([data[0][0][0].numpy()])[0]
    with torch.no_grad():
        want = PrefixModule(prefix)(data[0][0][0]).numpy()
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()  # 8-bit activations


def test_missing_htp_backend_fails_at_load_and_cpu_still_works(monkeypatch):
    model, prog, data = _case("keyboard")
    monkeypatch.setenv("POCK_QNN_HTP_LIB", "/nonexistent/libQnnHtp.so")
    with pytest.raises(pe.PockError, match=r"'htp' backend needs QNN's HTP backend library.*libQnnHtp"):
        prog.build(backends=["htp", "cpu"])
    trainer = prog.build(backends=["cpu"])
    assert np.isfinite(trainer.step(*data[0]))


def test_ai_hub_without_an_account_is_a_clear_error(monkeypatch, tmp_path):
    model, prog, data = _case("keyboard")
    prefix, _ = split_prefix(prog)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("QAI_HUB_API_TOKEN", raising=False)
    with pytest.raises(pe.PockError, match="qai-hub|AI Hub account"):
        submit_ai_hub(prefix, "sm8550")
