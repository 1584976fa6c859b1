"""compute_dtype's arm64 arithmetic under qemu-aarch64: fp16 FMLA (kernels/lowp_fmla.cpp) and bf16
BFMMLA (kernels/lowp_dot.cpp) on the frozen-weight products, judged against float64.

* the exact numerics: fp16 outputs equal pockengine.passes.compute_dtype.fmla_linear's emulation
  (fp16 fused multiply-adds over chunks of 16 depth steps, the chunk sums added in fp32);
* the format's error bound against the float64 product of the UNROUNDED operands, per output:
      fp16: (2 u16 + 16 u16 + ceil(D / 16) u32) * sum_l |x_l w_l|     u16 = 2^-11 (11-bit significand)
      bf16: (2 u8  + D u32) * sum_l |x_l w_l|                          u8  = 2^-8  (8-bit significand)
  (operand rounding: two relative errors of u each; fp16 chunk sums: at most 16 roundings of
  partial sums bounded by the chunk's sum |x w|; fp32 sums: u32 = 2^-24 per addition), and on
  these data the fp16 error is below the bf16 error (fp16 FMLA does not trade away bf16's accuracy);
* ranges: activations of 3e4 and gradients of 1e-7 against weights of 1e2 and 1e-3: no overflow to
  inf, no flush to zero (the activation operand's power-of-two scale, lowp.cpp fmla_scale);
* (slow) a baseline armv8-a build chooses FMLA at run time from the hwcaps: FMLA's numerics on
  -cpu max, the portable fp32 path on -cpu cortex-a53 (no fp16 arithmetic);
* (slow) end to end: tests/compiler/test_compute_dtype.py's tiny Llama scheme with compute_dtype
  fp16 / bf16 trained under qemu through pock.h, judged against PyTorch fp64 and autocast as on the host.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from pockengine.ops.kernels import driver_source, driver_kernels
from pockengine.passes.compute_dtype import (fmla_linear, fmla_linear_bwd_input, round_operand, round_to)
from pockengine.schemes.quant import dequantize, quantize

from test_arm64 import HERE, cross, read_tensors, write_tensors  # noqa: E402  (tests/arm64 on sys.path)

pytestmark = pytest.mark.skipif(bool(cross.missing_tools()),
                                reason=f"aarch64 cross tools missing: {', '.join(cross.missing_tools())} "
                                       "(apt-get install g++-aarch64-linux-gnu qemu-user)")
U16, U8, U32 = 2.0**-11, 2.0**-8, 2.0**-24
CD = {"bf16": 0, "f16": 1}
DT = {"bf16": 0, "f16": 1, "i8": 2, "q4": 3}


def product_cases(rng):
    """(name, storage, x, w, dy, wd): SmolLM2-like depths (576, 1536) cut to a few rows, odd shapes,
    and the range cases."""
    shapes = [("smollm2_qo", 4, 40, 576, 1.0, 576**-0.5, 1.0), ("smollm2_down", 3, 24, 1536, 1.0, 1536**-0.5, 1.0),
              ("odd", 7, 19, 45, 1.0, 0.2, 1.0),
              ("big_x_big_w", 5, 21, 64, 3e4, 1e2, 1.0), ("tiny_dy_small_w", 5, 21, 64, 1.0, 1e-3, 1e-7)]
    for (name, M, N, K, xs, ws, gs), dt in zip(shapes, ["f16", "f16", "bf16", "f16", "q4"]):
        w = (rng.standard_normal((N, K)) * ws).astype(np.float32)
        q, scale = quantize(w, dt)
        wd = dequantize(q, dt, scale).astype(np.float32)
        x = (rng.standard_normal((M, K)) * xs).astype(np.float32)
        dy = (rng.standard_normal((M, N)) * gs).astype(np.float32)
        yield name, dt, q, scale, x, wd, dy


def run_products(tmp_path, cases, cpu="max"):
    """The *_cd kernels of every case in both formats, through kernel_check.cpp under qemu;
    returns {(name, cd, "y" | "dx"): float64 output}."""
    callable_ = set(driver_kernels())
    (tmp_path / "calls.cpp").write_text(driver_source(callable_))
    exe = cross.build_executable([HERE / "kernel_check.cpp", tmp_path / "calls.cpp"], tmp_path / "kernel_check")
    inputs, keys = {}, {}
    for i, (name, dt, q, scale, x, wd, dy) in enumerate(cases):
        M, K = x.shape
        N = wd.shape[0]
        codes = q.view(np.uint16) if dt == "f16" else q
        w = {f"w:{ {'bf16': 'uint16_t', 'f16': 'uint16_t', 'i8': 'int8_t', 'q4': 'uint8_t'}[dt]}": codes.astype(np.float64),
             **({"scale": np.asarray(scale, np.float64).reshape(-1)} if scale is not None else {})}
        for cd in CD:
            p = {k: np.array(float(v)) for k, v in dict(dt=DT[dt], M=M, N=N, K=K, cd=CD[cd]).items()}
            fwd, bwd = f"linear_fwd_lowp_cd.{i}{cd}", f"linear_bwd_input_lowp_cd.{i}{cd}"
            ins = {**p, "act": np.array(0.0), "x": x, "b": np.zeros(N), "y": np.zeros((M, N)), **w}
            inputs.update({f"{fwd}/{k}": np.asarray(v, np.float64) for k, v in ins.items()})
            ins = {**p, "dy": dy, "dx": np.zeros((M, K)), **w}
            inputs.update({f"{bwd}/{k}": np.asarray(v, np.float64) for k, v in ins.items()})
            keys[(name, cd, "y")], keys[(name, cd, "dx")] = f"{fwd}/y", f"{bwd}/dx"
    write_tensors(tmp_path / "in.bin", inputs)
    r = cross.run(exe, tmp_path / "in.bin", tmp_path / "out.bin", cpu=cpu)
    assert r.returncode == 0, f"kernel_check failed under qemu (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    got = read_tensors(tmp_path / "out.bin")
    return {k: got[v].astype(np.float64) for k, v in keys.items()}


def bound(a, b, cd):
    """The format's bound on |a @ b - fl(a @ b)| per output (module docstring), float64."""
    D = a.shape[1]
    mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    rel = (2 * U16 + 16 * U16 + math.ceil(D / 16) * U32) if cd == "f16" else (2 * U8 + D * U32)
    return rel * mag * (1 + 1e-6) + 1e-300


def test_fp16_fmla_and_bf16_against_fp64(tmp_path):
    cases = list(product_cases(np.random.default_rng(39)))
    got = run_products(tmp_path, cases)
    for name, dt, q, scale, x, wd, dy in cases:
        x64, w64, dy64 = x.astype(np.float64), wd.astype(np.float64), dy.astype(np.float64)
        exact = {"y": x64 @ w64.T, "dx": dy64 @ w64}
        err = {}
        for cd in CD:
            for out, (a, b) in {"y": (x64, w64.T), "dx": (dy64, w64)}.items():
                have = got[(name, cd, out)]
                assert np.isfinite(have).all(), f"{name} {cd} {out}: non-finite outputs"
                e = np.abs(have - exact[out])
                lim = bound(a, b, cd)
                # the bound is tighter than most outputs' magnitude, so it also catches a flush to zero
                assert (np.abs(exact[out]) > lim).mean() > 0.5, f"{name} {cd} {out}: bound too loose to judge"
                assert (e <= lim).all(), (f"{name} {cd} {out}: error {e.max():.3g} over the {cd} bound "
                                          f"(worst ratio {np.max(e / lim):.3g})")
                err[(cd, out)] = e
                if cd == "f16":  # FMLA's numerics exactly (fp32 outputs: a few fp32 ulps of slack)
                    want = fmla_linear(x, wd) if out == "y" else fmla_linear_bwd_input(dy, wd)
                    np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-6 * np.abs(want).max(),
                                               err_msg=f"{name} f16 {out}: not lowp_fmla.cpp's numerics")
                else:  # BFMMLA: fp32 accumulation of the exact products of the rounded operands
                    ar = round_operand(a if out == "dx" else x, "bf16")
                    wr = round_to(wd, "bf16").astype(np.float64)
                    want = ar @ wr if out == "dx" else ar @ wr.T
                    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
        if name.startswith("smollm2"):  # the fp16 arithmetic is more accurate than bf16's
            for out in ("y", "dx"):
                assert np.median(err[("f16", out)]) < np.median(err[("bf16", out)]), (name, out)


@pytest.mark.slow
def test_fp16_fmla_chosen_at_run_time(tmp_path, monkeypatch):
    """A baseline armv8-a build (no fp16 arithmetic at compile time): FMLA from the hwcaps on a
    core that has it (-cpu max: FMLA's numerics), the portable fp32 path on one that has not
    (-cpu cortex-a53: fp32 accumulation of the rounded operands)."""
    monkeypatch.setattr(cross, "TARGET", tuple(f if not f.startswith("-march=") else "-march=armv8-a"
                                               for f in cross.TARGET))
    cases = [c for c in product_cases(np.random.default_rng(40)) if c[0] in ("odd", "smollm2_qo")]
    for cpu in ("max", "cortex-a53"):
        (tmp_path / cpu).mkdir()
        got = run_products(tmp_path / cpu, cases, cpu=cpu)
        for name, dt, q, scale, x, wd, dy in cases:
            wr = round_to(wd, "f16").astype(np.float64)
            if cpu == "max":
                want = {"y": fmla_linear(x, wd), "dx": fmla_linear_bwd_input(dy, wd)}
            else:
                want = {"y": round_operand(x, "f16") @ wr.T, "dx": round_operand(dy, "f16") @ wr}
            for out in ("y", "dx"):
                np.testing.assert_allclose(got[(name, "f16", out)], want[out], rtol=1e-5,
                                           atol=1e-6 * np.abs(want[out]).max(), err_msg=f"{cpu} {name} {out}")


def _compute_dtype_tests():
    """tests/compiler/test_compute_dtype.py (its tiny Llama scheme and its autocast reference)."""
    import importlib.util
    path = HERE.parent / "compiler" / "test_compute_dtype.py"
    spec = importlib.util.spec_from_file_location("_compute_dtype_tests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # cross-compiles a model TU (~40 s of CPU each)
@pytest.mark.parametrize("cd", ["fp16", "bf16"])
def test_tiny_llama_compute_dtype_trained_on_arm64(cd, tmp_path):
    """tests/compiler/test_compute_dtype.py's scheme (tiny Llama, sparse + LoRA, 3 SGD steps) trained
    under qemu -cpu max (fp16 on FMLA, bf16 on BFMMLA) through pock.h, judged as on the host: losses and
    every trained tensor against PyTorch fp64, our error at most 2x that of PyTorch autocast running the
    same scheme (plus fp32's floor); the frozen products' weights never change."""
    import pockengine as pe
    from numerics import REL_FLOOR, fp64_reference

    tc = _compute_dtype_tests()
    model, data, _ = tc.tiny_llama_batches()
    steps, opt = 3, pe.SGD(lr=0.05, momentum=0.9)
    prog = pe.compile(tc.Logits(model), *data[0], update={f"m.{k}": v for k, v in tc.UPDATE.items()},
                      optimizer=opt, lora=pe.LoRA(**{**tc.LORA, "targets": [f"m.{t}" for t in tc.LORA["targets"]]}),
                      compute_dtype=cd)
    (tmp_path / "model.cpp").write_text(prog.source())
    exe = cross.build_executable([tmp_path / "model.cpp", HERE / "train_driver.c"], tmp_path / "train")
    host = prog.build()
    host.save(tmp_path / "start.ckpt")
    with open(tmp_path / "data.bin", "wb") as f:
        for i in range(steps):
            ins, tgs = data[i % len(data)]
            for t, io in zip([*ins, *tgs], host.inputs + host.targets):
                f.write(np.ascontiguousarray(t.numpy(), dtype=io.dtype).tobytes())
    r = cross.run(exe, tmp_path / "start.ckpt", tmp_path / "data.bin", steps, tmp_path / "arm.ckpt", 2)
    assert r.returncode == 0, f"train_driver failed under qemu (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    losses = [float(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("loss ")]
    assert len(losses) == steps
    arm = prog.build()
    arm.load(tmp_path / "arm.ckpt")
    sd = arm.state_dict()

    ref_update = {f"m.{k}": v for k, v in tc.REF_UPDATE.items()}
    ref = fp64_reference(prog.lora_model, data, "cross_entropy", ref_update, opt, steps)
    ac_losses, ac_model = tc.autocast_train(prog.lora_model, data, ref_update, opt, steps, tc.AUTOCAST[cd])
    trained = {n: p for n, p in ref.model64.named_parameters() if n in prog.trained}
    assert len(trained) > 10
    ours = tc.errors(sd, trained)
    theirs = tc.errors({n: p.detach().numpy() for n, p in ac_model.named_parameters()}, trained)
    for n in trained:
        floor = 4 * REL_FLOOR * float(trained[n].detach().abs().max()) + 1e-7
        assert ours[n] <= 2 * theirs[n] + floor, (n, ours[n], theirs[n])
    ours_l = max(abs(a - b) for a, b in zip(losses, ref.losses64))
    theirs_l = max(abs(a - b) for a, b in zip(ac_losses, ref.losses64))
    print(f"{cd} on arm64: loss errors against fp64, ours {ours_l:.3g}, autocast {theirs_l:.3g}; trained tensors "
          f"(worst ratio) {max(ours[n] / max(theirs[n], 1e-30) for n in trained):.3g}")
    assert ours_l <= 2 * theirs_l + 1e-6 * abs(ref.losses64[0]), (losses, ac_losses, ref.losses64)
    before = host.state_dict()
    for n, v in prog.state.items():  # frozen products' weights: never touched
        if v.kind == "param" and v.dtype != "f32":
            np.testing.assert_array_equal(sd[n], before[n], err_msg=n)
