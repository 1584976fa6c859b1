"""Every call of the Kotlin SDK's one vocabulary (sdk-android) on this machine's JVM, each
against a host JNI build of a small MLP (float inputs, a partial update, SGD with momentum):
forward (new and caller buffers), getTensor/setTensor, lastStepStatus/skippedSteps on a NaN
batch (skipped, not thrown; strict throws), train() with progress and coroutine cancellation,
profile, trained-only save/load in both directions with Python, PockTrainingWorker on the
android stubs (skips the bad batch, checkpoints, resumes after the OS stops it), and a
federated round: the Kotlin client's fit against the Python server's Flower strategy on
127.0.0.1.  SdkJvmTest.kt drives the SDK and prints what it saw.

The federated transport is a minimal loopback protocol (HTTP, a JSON line + Flower's .npy
tensor bytes), not Flower's gRPC: there is no gRPC/protobuf for Kotlin here.  The server
side hands the upload to the same SparseFedAvg.aggregate_fit a Flower server runs."""
from __future__ import annotations

import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
import torch.nn as nn

import pockengine as pe
from pockengine.runtime.checkpoint import read_checkpoint
from pockengine.platforms import android
from shared_build import build_jvm_model, jvm_toolchain_missing, run_kotlin_main, run_once

HERE = os.path.dirname(os.path.abspath(__file__))
N_BATCHES, NAN_BATCH = 6, 2

pytestmark = pytest.mark.skipif(bool(jvm_toolchain_missing()), reason=f"{jvm_toolchain_missing()}")


def mlp_program():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    return pe.compile(model, (x,), (y,), loss="cross_entropy", update={"0.weight": 0.5, "2.*": 1.0},
                      optimizer=pe.SGD(lr=0.1, momentum=0.9), name="sdkmlp")


def make_batches():
    rng = np.random.default_rng(0)
    out = []
    for i in range(N_BATCHES):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        if i == NAN_BATCH:
            x[1, 3] = np.nan
        out.append((x, rng.integers(0, 4, 4).astype(np.int64)))
    return out


class FedServer:
    """One round of SparseFedAvg served on 127.0.0.1: GET /fit gives the scheme and the global
    arrays (Flower's .npy bytes), POST /fit takes the client's upload into aggregate_fit."""

    def __init__(self, strategy, scheme: str):
        from flwr.common import ndarrays_to_parameters
        self.strategy, self.scheme, self.uploads = strategy, scheme, []
        self.blobs = ndarrays_to_parameters(strategy.global_arrays()).tensors
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                head = json.dumps({"round": 1, "scheme": json.loads(owner.scheme),
                                   "lengths": [len(b) for b in owner.blobs]})
                self._send(head.encode() + b"\n" + b"".join(owner.blobs))

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                line, rest = body.split(b"\n", 1)
                head = json.loads(line)
                blobs, pos = [], 0
                for n in head["lengths"]:
                    blobs.append(rest[pos:pos + n])
                    pos += n
                self._send(json.dumps(owner.receive(head, blobs)).encode())

            def _send(self, data: bytes):
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def receive(self, head, blobs):
        from flwr.common import Code, FitRes, Parameters, Status
        res = FitRes(Status(Code.OK, ""), Parameters(tensors=blobs, tensor_type="numpy.ndarray"),
                     int(head["num_examples"]), {"scheme": head["scheme"], "loss": float(head["loss"])})
        self.uploads.append(sum(len(b) for b in blobs))
        self.strategy.aggregate_fit(1, [(None, res)], [])
        return {"round": 1, "clients": 1, "loss": self.strategy.rounds[-1].loss}

    def close(self):
        self.httpd.shutdown()


def _build_and_run(out):
    from pockengine.federated import sparse
    from pockengine.federated.flower import SparseFedAvg
    prog = mlp_program()
    bundle, library = build_jvm_model(prog, out)
    batches = make_batches()
    (out / "batches.bin").write_bytes(b"".join(x.tobytes() + y.tobytes() for x, y in batches))
    assets = out / "assets" / "pockengine" / "sdkmlp"
    shutil.copytree(bundle, assets)

    # Python's trained-only checkpoint after 3 steps (Kotlin loads it)
    py = prog.build()
    py.load(bundle / "weights.pockckpt")
    for _ in range(3):
        py.step((batches[0][0],), (batches[0][1],))
    py.save(out / "py_trained.pockckpt", trained_only=True)
    py_state = {n: py.get_tensor(n).tolist() for n in ("0.weight", "2.weight", "2.bias", "2.weight:momentum_buffer")}

    # the federated server: the scheme's elements and their global (bundle) values
    base = prog.build()
    base.load(bundle / "weights.pockckpt")
    shapes = sparse.trainer_param_shapes(base)
    elements = sparse.program_elements(prog, shapes)
    strategy = SparseFedAvg(elements, {e.name: base.get_tensor(e.name) for e in elements},
                            clients_per_round=1, population=1, log=lambda *a: None)
    server = FedServer(strategy, sparse.encode_scheme(elements))

    jars = [android.kotlin_core_jar(), android.kotlin_android_jar(), android.android_stubs_jar()]
    test_jar = android.compile_kotlin([os.path.join(HERE, "SdkJvmTest.kt")], "sdk-jvm-test",
                                      classpath=[*jars, android.kotlin_stdlib(), android.kotlin_coroutines()])
    work = out / "work"
    work.mkdir()
    shutil.move(str(out / "assets"), str(work / "assets"))
    try:
        facts = run_kotlin_main([*jars, test_jar], "SdkJvmTestKt",
                                [bundle, library, out / "batches.bin", work, out / "py_trained.pockckpt", server.url],
                                "SdkJvmTest")
    finally:
        server.close()

    # Python's side of the round trips and the federated reference fit (the same steps in Python)
    checks = {}
    kt_full = read_checkpoint(work / "kt_full.pockckpt")
    fresh = prog.build()
    fresh.load(bundle / "weights.pockckpt")
    fresh.load(work / "kt_trained.pockckpt")  # Kotlin's trained-only file into Python
    checks["py_loads_kt_trained"] = all(np.array_equal(fresh.get_tensor(n), a) for n, (_, a) in kt_full.tensors.items()) \
        and fresh.step_count == kt_full.step
    after_py = read_checkpoint(work / "kt_after_py.pockckpt")
    checks["kt_loads_py_trained"] = all(np.array_equal(after_py.tensors[n][1], np.array(v, np.float32))
                                        for n, v in py_state.items()) and after_py.step == 3
    ref = prog.build()
    ref.load(bundle / "weights.pockckpt")
    sparse.write_elements(ref, elements, strategy_globals_before(elements, base))
    for x, y in batches:
        ref.step((x,), (y,))
    want = sparse.read_elements(ref, elements)
    checks["fed_global_is_the_fit"] = all(np.array_equal(strategy.global_params[e.name][e.index()], w)
                                          for e, w in zip(elements, want))
    checks["fed_frozen_channels_kept"] = bool(np.array_equal(strategy.global_params["0.weight"][:, 4:],
                                                             base.get_tensor("0.weight")[:, 4:]))
    checks["fed_upload_bytes"] = server.uploads
    checks["fed_payload_bytes"] = strategy.rounds[-1].payload_bytes
    checks["elements"] = [[e.name, e.k] for e in elements]
    for t in (py, base, fresh, ref):
        t.close()
    return {"facts": facts, "checks": checks}


def strategy_globals_before(elements, base):
    return [np.ascontiguousarray(base.get_tensor(e.name)[e.index()]) for e in elements]


@pytest.fixture(scope="module")
def sdk_run(tmp_path_factory):
    _, result = run_once(tmp_path_factory, "android-sdk-jvm", _build_and_run)
    return result["facts"], result["checks"]


def test_vocabulary_forward_tensors_learning_rate(sdk_run):
    facts, _ = sdk_run
    names = [s.split(":")[0] for s in facts["state_tensors"].split(";")]
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= set(names)  # (private tensors first since issue 36)
    assert "2.weight" in facts["state_tensors"] and "OPTIMIZER_STATE" in facts["state_tensors"]
    assert facts["forward"] == "PockTensor(f32[4, 4])" and facts["forward_into_equal"] == "true"
    assert facts["get_tensor"] == "PockTensor(f32[4, 16])" and facts["set_get_equal"] == "true"
    assert facts["error.set_wrong_shape"].startswith("SHAPE ") and "[4, 16]" in facts["error.set_wrong_shape"]
    assert facts["error.unknown_tensor"].startswith("INVALID_ARGUMENT ") and "nope.weight" in facts["error.unknown_tensor"]
    assert float(facts["learning_rate"]) == pytest.approx(0.05)


def test_a_nonfinite_batch_is_skipped_and_counted_unless_strict(sdk_run):
    facts, _ = sdk_run
    assert facts["skip_loss_finite"] == "false" and facts["skip_status"] == "SKIPPED"
    assert facts["skipped_steps"] == "1" and facts["skip_state_kept"] == "true" and facts["after_good_status"] == "OK"
    assert "input" in facts["skip_message"]
    assert facts["error.strict"].startswith("NONFINITE ") and facts["strict_skipped_steps"] == "1"


def test_train_reports_progress_and_cancels_between_steps(sdk_run):
    facts, _ = sdk_run
    assert facts["progress"] == "1:OK:1 2:OK:1 3:SKIPPED:2 4:OK:2 5:OK:2 6:OK:2"
    assert facts["train_result"] == "6 1 true"
    assert facts["cancel"] == "true 5"  # cancelled at step 5's progress: no 6th step


def test_profile_gives_per_kernel_times(sdk_run):
    facts, _ = sdk_run
    assert int(facts["profile_nodes"]) > 5 and facts["profile_sane"] == "true"
    assert "linear" in facts["profile_kernels"] and facts["profile_phases"] == "backward,forward,update"


def test_trained_only_checkpoints_round_trip_with_python(sdk_run):
    facts, checks = sdk_run
    full, lite = map(int, facts["sizes"].split())
    assert lite < full
    assert facts["trained_only_equal"] == "true" and facts["trained_only_next_loss_equal"] == "true"
    assert facts["py_trained_step_count"] == "3" and checks["kt_loads_py_trained"]
    assert checks["py_loads_kt_trained"]
    assert facts["error.other_base"].startswith("CHECKPOINT ") and "other base weights" in facts["error.other_base"]
    assert facts["other_base_state_kept"] == "true"


def test_worker_skips_bad_batches_checkpoints_and_resumes(sdk_run):
    facts, _ = sdk_run
    assert facts["worker_run1"] == "Retry 3"             # the OS stopped it before batch 3
    assert facts["worker_run2"] == "Success 3 0 6 false"  # resumed at batch 3, finished, progress forgotten
    assert facts["worker_equal_uninterrupted"] == "true" and facts["worker_step_count"] == str(N_BATCHES - 1)
    assert facts["worker_run3"].startswith("Failure ") and "input 0" in facts["worker_run3"]
    assert facts["worker_run3_step_count"] == str(N_BATCHES - 1 + 2)  # the two steps before the error kept


def test_federated_round_from_the_kotlin_client(sdk_run):
    facts, checks = sdk_run
    assert facts["fed_elements"] == "0.weight:4;2.weight:null;2.bias:null" == \
        ";".join(f"{n}:{'null' if k is None else k}" for n, k in checks["elements"])
    assert checks["fed_upload_bytes"] == [int(facts["fed_upload_bytes"])]
    assert checks["fed_payload_bytes"] == [(16 * 4 + 4 * 16 + 4) * 4]  # only the scheme's elements
    assert checks["fed_global_is_the_fit"] and checks["fed_frozen_channels_kept"]
    assert json.loads(facts["fed_reply"])["clients"] == 1 and facts["fed_skipped"] == "1"
    assert facts["done"] == "true"
    assert "FATAL" not in facts["_stderr"] and "WARNING in native method" not in facts["_stderr"]
