"""The Hexagon HTP backend: the frozen prefix on Qualcomm's NPU through QNN.

    trainer = prog.build(backends=["htp", "cpu"])   # -> build_with_htp_prefix(prog, ["cpu"], None)

The frozen prefix (passes/prefix.py) is exported to ONNX (onnx_export.py) and
compiled offline, on this build host, into a QNN context binary for one SoC
(`soc_model` / `htp_arch` from platforms/socs.py) by `onnxruntime-qnn`'s
execution provider with EP-context generation on.  Here, on x86-64, the same
provider runs the context binary on the QNN HTP simulator (libQnnHtp.so for
x86-64) before each compiled step; on Android the SDK runs it with ONNX
Runtime's Java API and the QNN EP.  The generated C++ never calls QNN: the
suffix step simply takes the prefix outputs as inputs.

Numerics: fp16 on the HTP rounds each prefix output to fp16 (relative error
<= 2^-11 per rounding, compounded over the prefix's layers), so a step with
the HTP prefix matches the all-CPU step to about 1e-3 relative, not 1e-5
(tests/backends/test_htp.py measures it); int8 QDQ is looser still.

Context binaries are cached under $POCK_CACHE_DIR/htp/<hash of ONNX bytes,
SoC, precision, QNN version>, so rebuilding an unchanged model compiles nothing.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np

from ..errors import PockError
from ..build.prefix_stage import build_with_prefix
from ..passes.prefix import FrozenPrefix, split_prefix, torch_supports
from ..platforms.socs import get_soc
from . import Backend, Device, register
from .onnx_export import export_onnx

DEFAULT_SOC = "sm8550"
QNN_EP = "QNNExecutionProvider"
_LOCK = threading.Lock()
_REGISTERED: dict[str, object] = {}


# ---- the QNN execution provider --------------------------------------------------------------
def qnn_paths() -> tuple[str, str]:
    """(QNN EP plugin library, QNN HTP backend library); $POCK_QNN_EP_LIB / $POCK_QNN_HTP_LIB override."""
    try:
        import onnxruntime_qnn
    except ImportError:
        raise PockError("the 'htp' backend needs the QNN execution provider for ONNX Runtime "
                        "(pip install onnxruntime-qnn); this machine lacks it - use backends=['cpu']") from None
    ep = os.environ.get("POCK_QNN_EP_LIB") or onnxruntime_qnn.get_library_path()
    htp = os.environ.get("POCK_QNN_HTP_LIB") or onnxruntime_qnn.get_qnn_htp_path()
    return ep, htp


def qnn_devices(ep_lib: str | None = None):
    """The QNN EP's ONNX Runtime devices, registering the plugin library once per process."""
    import onnxruntime as ort

    ep_lib = ep_lib or qnn_paths()[0]
    with _LOCK:
        if QNN_EP not in _REGISTERED:
            if not os.path.isfile(ep_lib):
                raise PockError(f"the 'htp' backend needs the QNN execution provider library, but {ep_lib} does "
                                "not exist on this machine; use backends=['cpu']")
            try:
                ort.register_execution_provider_library(QNN_EP, ep_lib)
            except Exception as e:  # noqa: BLE001 - ORT raises its own types
                if "already registered" not in str(e):
                    raise PockError(f"the 'htp' backend cannot load the QNN execution provider {ep_lib}: {e}; "
                                    "use backends=['cpu']") from None
            _REGISTERED[QNN_EP] = ep_lib
            ort.set_default_logger_severity(3)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN_EP]
    if not devices:
        raise PockError("the 'htp' backend: ONNX Runtime lists no QNN device on this machine; use backends=['cpu']")
    return devices


def _session(model_path, soc, precision: str, context_out: Path | None = None):
    import onnxruntime as ort

    ep_lib, htp_lib = qnn_paths()
    if not os.path.isfile(htp_lib):
        raise PockError(f"the 'htp' backend needs QNN's HTP backend library, but {htp_lib} does not exist on this "
                        "machine; use backends=['cpu']")
    so = ort.SessionOptions()
    options = {"backend_path": htp_lib, "htp_arch": str(soc.htp_arch), "soc_model": str(soc.qnn_soc_model),
               "htp_graph_finalization_optimization_mode": "3"}
    if precision == "fp16":
        options["enable_htp_fp16_precision"] = "1"
    so.add_provider_for_devices(qnn_devices(ep_lib), options)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # all of it on the HTP, or an error
    if context_out is not None:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", str(context_out))
        so.add_session_config_entry("ep.context_embed_mode", "0")
    try:
        return ort.InferenceSession(str(model_path), so)
    except Exception as e:  # noqa: BLE001 - ORT raises its own types
        msg = str(e).splitlines()[0][:500]
        if "QnnHtp" in msg or "backend" in msg.lower() and "load" in msg.lower():
            raise PockError(f"the 'htp' backend cannot load QNN's HTP backend {htp_lib}: {msg}; "
                            "use backends=['cpu']") from None
        raise PockError(f"QNN could not compile the frozen prefix for {soc.name} (HTP v{soc.htp_arch}): {msg}") from None


def _htp_soc(soc):
    soc = get_soc(soc) if isinstance(soc, str) else soc
    if not soc.htp_arch or not soc.qnn_soc_model:
        raise PockError(f"SoC {soc.name} ({soc.marketing}) has no Hexagon HTP; its backends are {soc.backends}")
    return soc


def binary_info(bin_path) -> dict:
    """{"soc": "SM8550", "htp_arch": 73} as recorded inside a QNN HTP context binary."""
    data = Path(bin_path).read_bytes()
    m = re.search(rb"soc_type=(\w+);arch=(\d+)", data)
    if m is None:
        raise PockError(f"{bin_path}: not a QNN HTP context binary (no SoC record)")
    return {"soc": m.group(1).decode(), "htp_arch": int(m.group(2))}


# ---- compiling the prefix ------------------------------------------------------------------------
def _cache_root() -> Path:
    return Path(os.environ.get("POCK_CACHE_DIR", Path.home() / ".cache" / "pockengine")) / "htp"


def compile_prefix(prefix: FrozenPrefix, soc=DEFAULT_SOC, precision: str = "fp16", calibration=None,
                   cache_dir=None) -> dict:
    """Export the prefix to ONNX and compile it to a QNN context binary for `soc` (cached).

    Returns {"dir", "onnx", "context", "binary", "soc", "htp_arch", "precision"} with absolute paths:
    "onnx" the portable model (the SDK's fallback), "context" the EP-context ONNX wrapper that ORT
    loads, "binary" the QNN context binary it points to."""
    import onnxruntime_qnn

    soc = _htp_soc(soc)
    root = Path(cache_dir) if cache_dir else _cache_root()
    tmp = root / f"tmp-{os.getpid()}-{threading.get_ident()}"
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        onnx_path = export_onnx(prefix, tmp / "prefix.onnx", precision, calibration)
        key = hashlib.sha256(onnx_path.read_bytes() + f"|{soc.name}|{soc.htp_arch}|{soc.qnn_soc_model}|{precision}|"
                             f"{onnxruntime_qnn.__version__}".encode()).hexdigest()[:16]
        final = root / f"{key}-{soc.name}-{precision}"
        if not (final / "prefix_ctx.onnx").is_file():
            _session(onnx_path, soc, precision, context_out=tmp / "prefix_ctx.onnx")
            for extra in tmp.glob("prefix_*.onnx"):
                if extra.name != "prefix_ctx.onnx":
                    extra.unlink()
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            try:
                tmp.rename(final)
            except OSError:  # another process won the race: use its copy
                pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bins = sorted(final.glob("*.bin"))
    if not bins:
        raise PockError(f"QNN produced no context binary for the prefix in {final}")
    info = binary_info(bins[0])
    return {"dir": final, "onnx": final / "prefix.onnx", "context": final / "prefix_ctx.onnx", "binary": bins[0],
            "soc": info["soc"], "htp_arch": info["htp_arch"], "precision": precision, "soc_name": soc.name}


def export_htp_prefix(prefix: FrozenPrefix, bundle_dir, soc=DEFAULT_SOC, precision: str = "fp16",
                      calibration=None, built: dict | None = None) -> dict:
    """Copy the compiled prefix (`built`, compile_prefix's result, compiled here when not
    given) into bundle_dir/prefix/ and return the bundle's manifest["prefix"]."""
    built = built or compile_prefix(prefix, soc, precision, calibration)
    out = Path(bundle_dir) / "prefix"
    out.mkdir(parents=True, exist_ok=True)
    for key in ("onnx", "context", "binary"):
        shutil.copyfile(built[key], out / built[key].name)
    files = {"onnx": f"prefix/{built['onnx'].name}", "context": f"prefix/{built['context'].name}",
             "context_binary": f"prefix/{built['binary'].name}"}
    return prefix.manifest(files=files, soc=_htp_soc(soc), precision=precision, runtime="onnxruntime-qnn")


class HtpRunner:
    """run(arrays) -> arrays: the compiled prefix on the QNN HTP (the simulator on x86-64)."""

    def __init__(self, prefix: FrozenPrefix, built: dict):
        self.prefix, self.built = prefix, built
        self.session = _session(built["context"], _htp_soc(built["soc_name"]), built["precision"])
        self._in = [i.name for i in self.session.get_inputs()]
        self._out = [o["name"] for o in prefix.outputs]

    def __call__(self, arrays):
        feeds = {name: np.ascontiguousarray(a) for name, a in zip(self._in, arrays)}
        try:
            return self.session.run(self._out, feeds)
        except Exception as e:  # noqa: BLE001 - ORT raises its own types
            raise PockError(f"the HTP prefix failed to run: {str(e).splitlines()[0][:300]}") from None


def build_with_htp_prefix(prog, other_backends, out_dir=None, soc=DEFAULT_SOC, precision: str = "fp16",
                          calibration=None):
    """The step with its frozen prefix on the HTP and the rest on `other_backends`: the suffix's
    Trainer with a PrefixRunner over the HTP session as its input stage (build/prefix_stage.build_with_prefix).

    With no frozen prefix to move, the step is built on the other backends alone."""
    built = []

    def prepare(prefix):
        qnn_devices()  # fail early, naming the missing piece, before any compiling
        built.append(compile_prefix(prefix, soc, precision, calibration))
        if out_dir is not None:
            manifest = export_htp_prefix(prefix, out_dir, soc, precision, built=built[0])
        else:
            manifest = prefix.manifest(files={"onnx": str(built[0]["onnx"]), "context": str(built[0]["context"]),
                                              "context_binary": str(built[0]["binary"])}, soc=_htp_soc(soc),
                                       precision=precision, runtime="onnxruntime-qnn")
        return HtpRunner(prefix, built[0]), manifest

    return build_with_prefix(prog, other_backends, out_dir, "htp", prepare)


# ---- Qualcomm AI Hub -------------------------------------------------------------------------------
def ai_hub_config() -> Path | None:
    """The qai-hub client config that holds an API token, or None."""
    if os.environ.get("QAI_HUB_API_TOKEN"):
        return Path("<env QAI_HUB_API_TOKEN>")
    path = Path(os.environ.get("QAIHUB_CLIENT_INI", Path.home() / ".qai_hub" / "client.ini"))
    try:
        return path if path.is_file() and "api_token" in path.read_text() else None
    except OSError:
        return None


def submit_ai_hub(prefix: FrozenPrefix, soc=DEFAULT_SOC, onnx_path=None) -> dict:
    """Compile and profile the prefix on a real device on Qualcomm AI Hub.

    Needs `qai-hub` (pip install qai-hub) and an account (`qai-hub configure --api_token ...`);
    without either it is a PockError at once, never a wait on the network."""
    soc = _htp_soc(soc)
    try:
        import qai_hub
    except ImportError:
        raise PockError("--ai-hub needs the qai-hub package (pip install qai-hub) and a Qualcomm AI Hub account "
                        "(qai-hub configure --api_token TOKEN)") from None
    if ai_hub_config() is None:
        raise PockError("--ai-hub needs a Qualcomm AI Hub account: no API token found (run "
                        "`qai-hub configure --api_token TOKEN` or set QAI_HUB_API_TOKEN)")
    onnx_path = onnx_path or export_onnx(prefix, _cache_root() / f"aihub-{os.getpid()}" / "prefix.onnx")
    try:
        device = qai_hub.Device(attributes=f"chipset:qualcomm-{soc.marketing.lower().replace(' ', '-')}")
        shapes = {i["name"]: (tuple(i["shape"]), "int32" if i["dtype"] in ("i64", "i32") else "float32")
                  for i in prefix.inputs}
        compile_job = qai_hub.submit_compile_job(model=str(onnx_path), device=device, input_specs=shapes,
                                                 options="--target_runtime qnn_context_binary")
        target = compile_job.get_target_model()
        profile_job = qai_hub.submit_profile_job(model=target, device=device)
        profile = profile_job.download_profile()
    except Exception as e:  # noqa: BLE001 - the client raises many types
        raise PockError(f"Qualcomm AI Hub: {type(e).__name__}: {e}") from None
    return {"compile_job": compile_job.job_id, "profile_job": profile_job.job_id, "profile": profile}


__all__ = ["build_with_htp_prefix", "compile_prefix", "export_htp_prefix", "binary_info", "HtpRunner",
           "submit_ai_hub", "qnn_devices"]


# ---- registration (backends/__init__.py) -------------------------------------------------------------------
def _check_soc(soc) -> None:
    if not soc.htp_arch:
        raise PockError(f"--backends htp needs a SoC with a Hexagon HTP; {soc.name} has none (use e.g. --soc sm8550)")


register(Backend(
    "htp", Device(flops_per_s=1e12, dispatch_s=5e-6, handover_s=200e-6),
    role="prefix", inference_only=True,
    supports=torch_supports,  # what the prefix's torch module (exported to ONNX) runs: the partitioner's rule
    split=lambda prog: split_prefix(prog, "htp"), build_with=build_with_htp_prefix, check_target=_check_soc,
    export=lambda prefix, bundle_dir, soc=None: export_htp_prefix(prefix, bundle_dir, soc or DEFAULT_SOC),
    profile_remote=lambda prefix, soc=None: submit_ai_hub(prefix, soc or DEFAULT_SOC),
    platforms=("host", "android"),
    doc="the frozen forward prefix on the Qualcomm Hexagon NPU (QNN through ONNX Runtime)"))
