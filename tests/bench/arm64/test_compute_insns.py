"""bench/arm64/compute_insns.py (fp32 against bf16 / fp16 compute, aarch64 instructions per step) and
the bench/arm64/insn_count.c options it uses: the counts by code range (ranges=FILE, from the linker
map) and by instruction class (classes=1: BFMMLA, BFDOT, FMLA on fp16 / fp32 vectors), checked on a
program whose executed instructions are known; the argument checks; the report's path check (bf16
without BFMMLA is an error, not a row). (slow) a miniature end-to-end run."""
import importlib.util
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"


def _load():
    spec = importlib.util.spec_from_file_location("compute_insns", ROOT / "bench" / "arm64" / "compute_insns.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ci = _load()
needs_cross = pytest.mark.skipif(not all(shutil.which(t) for t in (CC, QEMU, "gcc")),
                                 reason="aarch64 cross tools missing (apt-get install gcc-aarch64-linux-gnu qemu-user)")

# one loop turn: 1 BFMMLA, 2 BFDOT, 2 FMLA .8h/.4h (vector and by element), 2 FMLA .4s (vector and by
# element), and instructions of none of the classes (FMLA .2d, scalar FMLA by element, FMADD, FMLAL)
HOT = r"""
void hot(long n) {
  for (long i = 0; i < n; ++i)
    __asm__ volatile(
        "bfmmla v0.4s, v1.8h, v2.8h\n"
        "bfdot v0.4s, v1.8h, v2.8h\n"
        "bfdot v0.2s, v1.4h, v2.2h[1]\n"
        "fmla v3.8h, v4.8h, v5.8h\n"
        "fmla v3.4h, v4.4h, v5.h[5]\n"
        "fmla v6.4s, v7.4s, v8.4s\n"
        "fmla v6.2s, v7.2s, v8.s[1]\n"
        "fmla v9.2d, v10.2d, v11.2d\n"
        "fmla s12, s13, v14.s[1]\n"
        "fmadd s12, s13, s14, s15\n"
        "fmlal v16.4s, v17.4h, v18.4h\n" ::: "v0", "v3", "v6", "v9", "v12", "v16", "memory");
}
"""
MAIN = r"""
#include <stdlib.h>
void hot(long n);
int main(int argc, char** argv) { hot(argc > 1 ? atol(argv[1]) : 0); return 0; }
"""
WANT = {"bfmmla": 1, "bfdot": 2, "fmla_f16": 2, "fmla_f32": 2}


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """(executable, its linker map, the plugin) of MAIN + HOT, hot() in its own object file."""
    tmp = tmp_path_factory.mktemp("insn_count")
    (tmp / "hot.c").write_text(HOT)
    (tmp / "main.c").write_text(MAIN)
    flags = ("-O1", "-march=armv8.6-a+bf16+fp16+fp16fml")
    for name in ("hot", "main"):
        subprocess.run([CC, *flags, "-c", str(tmp / f"{name}.c"), "-o", str(tmp / f"{name}.o")], check=True)
    exe = tmp / "prog"
    subprocess.run([CC, "-static", str(tmp / "main.o"), str(tmp / "hot.o"), f"-Wl,-Map={tmp / 'prog.map'}",
                    "-o", str(exe)], check=True)
    plugin = tmp / "libinsn_count.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", str(ROOT / "bench" / "arm64" / "insn_count.c"),
                    "-o", str(plugin)], check=True)
    return exe, tmp / "prog.map", plugin


def _counts(exe, plugin, n, args=""):
    r = subprocess.run([QEMU, "-cpu", "max", "-plugin", f"{plugin}{args}", "-d", "plugin", str(exe), str(n)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = {}
    for ln in r.stderr.splitlines():
        p = ln.split()
        got[" ".join(p[:-1])] = int(p[-1])
    return got


@needs_cross
def test_plugin_counts_classes_and_ranges(program, tmp_path):
    exe, map_file, plugin = program
    hot = [(s, e) for s, e, obj in ci.text_ranges(map_file) if Path(obj).name == "hot.o"]
    assert len(hot) == 1, "hot.o's .text not found in the linker map"
    (tmp_path / "ranges.txt").write_text(f"{hot[0][0]:x} {hot[0][1]:x} 7\n")
    args = f",ranges={tmp_path / 'ranges.txt'},classes=1"
    c10, c30 = _counts(exe, plugin, 10, args), _counts(exe, plugin, 30, args)
    for cls, k in WANT.items():
        assert c30[f"class {cls}"] - c10[f"class {cls}"] == 20 * k, (cls, c10, c30)
    # the loop body: 11 instructions plus the loop's own; all of hot()'s instructions are in group 7
    d_total, d_hot = c30["insns"] - c10["insns"], c30["group 7"] - c10["group 7"]
    assert d_hot == d_total and 20 * 11 < d_hot < 20 * 16, (c10, c30)
    plain = _counts(exe, plugin, 10)  # without options: the total alone, the same count
    assert plain == {"insns": c10["insns"]}


@needs_cross
def test_plugin_rejects_bad_arguments(program, tmp_path):
    exe, _, plugin = program
    (tmp_path / "bad.txt").write_text("200 100 1\n")  # end before start
    for args in (",nonsense=1", f",ranges={tmp_path / 'bad.txt'}", f",ranges={tmp_path / 'missing.txt'}"):
        r = subprocess.run([QEMU, "-cpu", "max", "-plugin", f"{plugin}{args}", "-d", "plugin", str(exe), "1"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, args


def test_map_sections_and_groups(tmp_path):
    """A GNU ld map's .text input sections (name and numbers on one line or two) -> the sources'
    groups; discarded sections before the memory map are not code."""
    (tmp_path / "x.map").write_text(
        "Discarded input sections\n\n .text._ZN2pk4dropEv\n                0x0000000000000000       0x40 /c/obj/lowp-"
        + "a" * 24 + ".o\n\nLinker script and memory map\n\n.text           0x0000000000400000     0x9000\n"
        " .text          0x0000000000400100      0x100 /usr/lib/gcc-cross/aarch64-linux-gnu/12/crt1.o\n"
        " .text._ZN2pk9lowp_cd_fEv\n                0x0000000000401000      0x200 /c/obj/lowp_dot-" + "b" * 24 + ".o\n"
        "                0x0000000000401000                pk::lowp_cd_f()\n"
        " .text          0x0000000000402000      0x300 /c/obj/gemm-" + "c" * 24 + ".o\n"
        " .text          0x0000000000403000        0x0 /c/obj/empty-" + "d" * 24 + ".o\n"
        " .text          0x0000000000404000       0x80 /c/obj/model-bf16-" + "e" * 24 + ".o\n"
        " .text          0x0000000000405000       0x80 /usr/lib/aarch64-linux-gnu/libc.a(memset.o)\n")
    got = ci.text_ranges(tmp_path / "x.map")
    assert [(hex(s), hex(e)) for s, e, _ in got] == [("0x400100", "0x400200"), ("0x401000", "0x401200"),
                                                     ("0x402000", "0x402300"), ("0x404000", "0x404080"),
                                                     ("0x405000", "0x405080")]
    stems = set(ci.runtime_stems())
    assert {"lowp", "lowp_dot", "lowp_fmla", "gemm", "optimizer"} <= stems
    sources = [ci.source_of(obj, stems) for *_, obj in got]
    assert sources == [ci.OUTSIDE, "lowp_dot", "gemm", "model", ci.OUTSIDE]
    assert [ci.group_of(s) for s in sources[1:4]] == ["frozen products (lowp*.cpp)",
                                                      "fp32 GEMM (gemm, gemv, linear*.cpp)",
                                                      "generated step (model TU)"]
    assert ci.group_of("checkpoint") == ci.OTHER_RT
    names = [*ci.runtime_stems(), "model", ci.OUTSIDE]
    ci.write_ranges(tmp_path / "x.map", tmp_path / "r.txt", names)
    lines = (tmp_path / "r.txt").read_text().split("\n")
    assert lines[1] == f"401000 401200 {names.index('lowp_dot')}"


def test_arguments():
    a = ci.parse_args([])
    assert a.compute == ["fp32", "bf16", "fp16"] and a.schemes == ["sparse", "lora"]
    assert ci.parse_args(["--compute", "bf16"]).compute == ["fp32", "bf16"]  # fp32: the baseline, always
    for bad in (["--compute", "int8"], ["--schemes", "full"], ["--trained", "5"], ["--heads", "7"],
                ["--kv-heads", "2"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            ci.parse_args(bad)


def _row(scheme, fp32, bf16, low16, bfmmla):
    def entry(insns, low, classes):
        groups = dict.fromkeys([*ci.GROUPS, ci.OTHER_RT, ci.OUTSIDE], 0.0)
        groups[next(iter(ci.GROUPS))] = low
        return {"insns": insns, "groups": groups, "classes": {**dict.fromkeys(ci.CLASS_NAMES, 0.0), **classes},
                "losses": [2.5], "flops_per_step": 1e9}
    return {"scheme": scheme, "compute": {"fp32": entry(fp32, 0.0, {"fmla_f32": 5e6}),
                                          "bf16": entry(bf16, low16, {"bfmmla": bfmmla})}}


def test_report_derives_the_frozen_share_and_checks_the_path():
    rows = [_row("sparse", 100e6, 70e6, 10e6, 1e6)]
    ci.derive(rows)
    assert rows[0]["frozen_products_fp32"] == 40e6  # 100 - (70 - 10)
    a = ci.parse_args(["--compute", "bf16", "--schemes", "sparse"])
    text = ci.report(rows, a)
    assert "| sparse | 1000 | 100.0 | 70.0 | 0.70x | 40.0 (40%) | 0.25x |" in text
    assert "compute_insns.py" in text.split("\n\n")[2]  # the command at the top
    no_bfmmla = [_row("sparse", 100e6, 70e6, 10e6, 0.0)]
    ci.derive(no_bfmmla)
    with pytest.raises(RuntimeError, match="not the expected path"):
        ci.report(no_bfmmla, a)
    assert "- sparse: the frozen products take 40 M of fp32's 100 M instructions a step (40%); bf16 does them " \
           "in 10 M (0.25x), the step 0.70x." in text and "below 0.60x fp32's" in text
    alone = [{"compute": {"fp32": rows[0]["compute"]["fp32"]}}]
    ci.derive(alone)
    assert math.isnan(alone[0]["frozen_products_fp32"])  # no lowp dtype to take the rest of the step from


def test_report_from_json(tmp_path):
    """--from-json rewrites the .md from a saved run, with that run's arguments."""
    rows = [_row("lora", 100e6, 50e6, 20e6, 2e6)]
    ci.derive(rows)
    args = {k: v for k, v in vars(ci.parse_args(["--compute", "bf16", "--layers", "3"])).items()
            if k not in ("out", "from_json")}
    (tmp_path / "saved.json").write_text(json.dumps({"args": args, "rows": rows}))
    assert ci.main(["--from-json", str(tmp_path / "saved.json"), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "compute_results.md").read_text()
    assert "cut to 3 blocks" in text and "| lora | 1000 | 100.0 | 50.0 | 0.50x | 70.0 (70%) | 0.29x |" in text


@pytest.mark.slow  # cross-compiles three model TUs and runs them under qemu (~1-2 min)
@needs_cross
def test_miniature_run(tmp_path):
    assert ci.main(["--layers", "2", "--trained", "1", "--hidden", "64", "--mlp", "128", "--heads", "4",
                    "--kv-heads", "2", "--vocab", "128", "--seq", "16", "--schemes", "sparse",
                    "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "compute_results.json").read_text())
    c = res["rows"][0]["compute"]
    assert c["bf16"]["classes"]["bfmmla"] > 0 and c["fp16"]["classes"]["fmla_f16"] > 0
    assert c["bf16"]["insns"] < c["fp32"]["insns"] and c["fp16"]["insns"] < c["fp32"]["insns"]
    assert abs(c["bf16"]["losses"][-1] - c["fp32"]["losses"][-1]) < 1e-2 * abs(c["fp32"]["losses"][-1])
    assert "bf16 / fp32" in (tmp_path / "compute_results.md").read_text()
