"""The hot kernels are vector code on the phone-class ISAs, not scalar fallbacks.

The kernel sources are compiled as a device build compiles them (-O3, as
platforms/android.py and ios.py), for -march=x86-64-v3 (AVX2 + FMA, no AVX-512) and,
with the cross compiler, for aarch64 (NEON), and the disassembly of each named kernel (its own function, the lambdas it
hands to parallel_for and the helpers named with it) must hold vector FMAs on full
vectors (`vfmadd...ps` on ymm; `fmla v.4s`) and, for the kernels that exponentiate,
the vector exp's 2^n construction (an integer shift by 23 on a full vector:
`vpslld $0x17, ymm`; `shl v.4s, #23`).  A loop that falls back to scalar code
(e.g. an approximation GCC stops vectorizing) fails here.

Objects are cached like the runtime's (pockengine.build.host's object cache), so a warm
run takes well under a second.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from pockengine.build.host import _digest, compile_objects, runtime_dir

KERNELS = runtime_dir() / "kernels"

# kernel source -> {function name (a regex alternative where GCC may inline a helper): what
# it must contain}; "fma": vector FMAs, "exp": the
# vector exp (and FMAs), "vec": any full-width vector arithmetic.
CHECKS = {
    "activation.cpp": {"gelu_fwd": "exp", "gelu_bwd": "exp", "sigmoid_fwd": "exp", "tanh_fwd": "exp",
                       "silu_fwd": "exp", "silu_bwd": "exp", "relu_fwd": "vec", "relu_bwd": "vec",
                       "tanh_bwd": "fma"},
    "loss.cpp": {"cross_entropy_fwd|row_logsumexp": "exp", "cross_entropy_bwd": "exp"},
    "softmax.cpp": {"softmax_impl": "exp", "log_softmax_bwd": "exp"},
    "attention.cpp": {"sdpa_fwd": "exp", "sdpa_bwd": "vec"},
    "linear_ce.cpp": {"linear_ce_fwd": "exp", "linear_ce_bwd": "exp", "linear_ce_fwd_dx": "exp"},  # its products are linear.cpp's / lowp.cpp's  # its products are gemm.cpp micro-kernels
    "layer_norm.cpp": {"layer_norm_fwd|layer_norm_row": "fma", "layer_norm_bwd": "fma"},
    "rms_norm.cpp": {"rms_norm_fwd|rms_norm_row": "fma", "rms_norm_bwd|rms_norm_row_bwd": "fma"},
    "swiglu.cpp": {"swiglu_fwd": "exp", "swiglu_bwd": "exp"},
    "rope.cpp": {r"rope<\w+>|rotate_row<\w+>": "fma"},
    "optimizer.cpp": {"sgd_update": "fma", "adamw_update": "fma"},
    "linear.cpp": {"bias_bwd": "vec"},
    "gemm.cpp": {"micro_kernel<[^>]*>": "fma", "gemm_dot_rows<[^>]*>": "fma", "gemv_block<[^>]*>": "fma"},
    "lowp.cpp": {"read_w": "vec", "read_wt": "vec"},
    "lstm.cpp": {r"lstm_fwd|cell_fwd_impl<\w+>": "exp", r"lstm_bwd|cell_bwd_impl<\w+>": "exp"},
    "gru.cpp": {"gru_fwd|gru_cell_fwd": "exp"},
    "conv2d_dw_small.cpp": {"dw_small_fwd|taps_all": "fma", "dw_small_bwd_input": "fma",
                            "dw_small_bwd_weight": "fma"},
    "conv2d_small_k.cpp": {r"small_k_fwd|tile_rows<\d>": "fma"},
    "batch_norm.cpp": {"train_fwd": "fma", "channel_affine": "fma", "batch_norm_eval_bwd": "fma",
                       # the train backward (dy plain, through relu, through relu6)
                       r"train_bwd<\(pk::Act\)0>": "fma", r"train_bwd<\(pk::Act\)1>": "fma",
                       r"train_bwd<\(pk::Act\)2>": "fma"},
}

TARGETS = {
    # name: (compiler, flags, objdump, vector FMA, vector exp's shift, any full-vector op)
    "x86-64-v3": ("g++", ("-O3", "-march=x86-64-v3"), "objdump",
                  r"^vfn?m(add|sub)\d+ps\s.*%ymm", r"^vpslld\s+\$0x17,.*%ymm", r"^v\w+ps\s.*%ymm"),
    "aarch64": ("aarch64-linux-gnu-g++", ("-O3", "-march=armv8.2-a+fp16+dotprod"), "aarch64-linux-gnu-objdump",
                r"^fml[as]\s+v\d+\.4s", r"^shl\s+v\d+\.4s,\s*v\d+\.4s,\s*#23", r"^f\w+\s+v\d+\.4s"),
}


def functions(objdump: str, obj: Path) -> dict[str, list[str]]:
    """Demangled function name -> its instructions (mnemonic and operands)."""
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    fns, cur = defaultdict(list), None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            cur = m.group(1)
        elif cur is not None and "\t" in line:
            fns[cur].append(line.split("\t", 1)[1].strip())
    return fns


@pytest.mark.parametrize("target", list(TARGETS))
def test_hot_kernels_are_vector_code(target, tmp_path):
    cxx, flags, objdump, fma_re, exp_re, vec_re = TARGETS[target]
    if shutil.which(cxx) is None or shutil.which(objdump) is None:
        pytest.skip(f"{cxx} / {objdump} not installed")
    rt = runtime_dir()
    headers = _digest(sorted(rt.rglob("*.h")))
    jobs = [(KERNELS / src, (*flags, "-std=c++17", "-fPIC", "-I", str(rt / "include"), "-I", str(rt)), headers)
            for src in CHECKS]
    objs = compile_objects(jobs, (cxx,), subdir=f"vectest/{target}", what=f"{target} kernel compilation")
    problems = []
    for (src, wants), obj in zip(CHECKS.items(), objs):
        fns = functions(objdump, obj)
        for name, want in wants.items():
            body = [ins for fn, insns in fns.items() if re.search(rf"\b(?:{name})\(", fn) for ins in insns]
            if not body:
                problems.append(f"{src}: no function named {name}")
                continue
            n_fma = sum(bool(re.search(fma_re, i)) for i in body)
            n_exp = sum(bool(re.search(exp_re, i)) for i in body)
            n_vec = sum(bool(re.search(vec_re, i)) for i in body)
            if want == "vec" and n_vec == 0:
                problems.append(f"{src}: {name} has no full-width vector arithmetic")
            if want in ("fma", "exp") and n_fma == 0:
                problems.append(f"{src}: {name} has no vector FMA")
            if want == "exp" and n_exp == 0:
                problems.append(f"{src}: {name} has no vector exp (2^n by a vector shift of 23)")
    assert not problems, f"scalar fallbacks for {target}:\n" + "\n".join(problems)
