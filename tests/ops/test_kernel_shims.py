"""pockengine.ops.kernels: the kernels the op records call, their signatures parsed from
pock_kernels.h, and the extern "C" test shims generated from the two."""
import ctypes

from pockengine.ops import REGISTRY
from pockengine.ops.kernels import (argtypes, kernels_of, plain, record_shim_kernels, shim_source, signatures,
                                    write_record_shims)


def test_signatures_are_parsed_from_the_header():
    sigs = signatures()
    lf = sigs["linear_fwd"]
    assert lf.ret == "void" and [p for _, p in lf.params] == ["x", "w", "b", "y", "M", "N", "K"]
    assert lf.params[0] == ("const float*", "x") and lf.params[-1] == ("i64", "K")
    assert sigs["embedding_fwd"].ret == "i64"
    assert plain(lf) and plain(sigs["linear_fwd_lowp"])  # an enum (LowpDtype, Act) travels as int
    assert plain(sigs["lstm_fwd"])  # LstmParams (scalar fields) travels as its fields
    assert plain(sigs["reduce_sum"])  # Reduce holds arrays: each travels as a pointer, packed by pack_Reduce
    assert plain(sigs["sdpa_fwd"])  # SdpaParams nests SdpaLayout: its members travel as q_sb, q_sh, ...
    assert sigs["strided_copy_int32_t"].call == "strided_copy<int32_t>"  # a template, per explicit instance
    assert argtypes(sigs["linear_fwd_act"]) == ([ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int], None)


def test_every_plain_kernel_a_record_calls_gets_a_generated_shim():
    kernels = record_shim_kernels()
    assert {"linear_fwd", "layer_norm_fwd", "batch_norm_train_fwd_act", "embedding_fwd_lowp"} <= set(kernels)
    sigs = signatures()  # a template's instances (strided_copy_float) count as the template the record names
    assert {sigs[k].template or k for k in kernels} <= set().union(*(kernels_of(r) for r in REGISTRY.values()))
    text = shim_source(["linear_fwd_act", "embedding_fwd"])
    assert ("void shim_linear_fwd_act(const float* x, const float* w, const float* b, float* y, pk::i64 M, "
            "pk::i64 N, pk::i64 K, int act) { pk::linear_fwd_act(x, w, b, y, M, N, K, static_cast<pk::Act>(act)); }"
            in text)
    assert "pk::i64 shim_embedding_fwd(" in text and "return pk::embedding_fwd(" in text
    assert ("float beta) { pk::gemm(A, B, C, pk::GemmParams{batch, M, N, K, ta != 0, tb != 0, sa, sb, sc, beta}); }"
            in shim_source(["gemm"]))


def test_kernels_with_a_hand_written_shim_are_left_out(tmp_path):
    hand = tmp_path / "conv_shim.cpp"
    hand.write_text("void shim_conv2d_fwd(const float* x, const long* v) {}\n")
    assert "conv2d_fwd" in record_shim_kernels() and "conv2d_fwd" not in record_shim_kernels(beside=[hand])


def test_the_generated_shims_compile_and_run():
    import numpy as np

    from pockengine.build.host import build_kernel_library
    lib = ctypes.CDLL(str(build_kernel_library([write_record_shims()], name="record_shims")))
    lib.shim_linear_fwd.argtypes, lib.shim_linear_fwd.restype = argtypes(signatures()["linear_fwd"])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.ones((4, 3), np.float32)
    y = np.zeros((2, 4), np.float32)
    P = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    lib.shim_linear_fwd(P(x), P(w), None, P(y), 2, 4, 3)
    np.testing.assert_array_equal(y, x @ w.T)
    assert write_record_shims().read_text() == shim_source(record_shim_kernels())


def test_the_case_file_driver_takes_every_parameter_by_name():
    from pockengine.ops.kernels import driveable, driver_kernels, driver_source
    sigs = signatures()
    assert driveable(sigs["lstm_fwd"]) and driveable(sigs["linear_fwd_lowp"])
    assert driveable(sigs["reduce_sum"]) and driveable(sigs["strided_copy_float"])  # arrays, templates
    assert {"linear_fwd", "lstm_bwd", "max_pool2d_fwd", "gemm", "linear_fwd_lowp"} <= set(driver_kernels())
    text = driver_source(["gemm", "embedding_fwd", "max_pool2d_fwd", "linear_bwd_input_lowp"])
    assert 'auto w = static_cast<const void*>(arg_ptr(args_, "w", "void", false));' in text  # the case says its type
    assert 'auto C = static_cast<float*>(arg_ptr(args_, "C", "float", true));' in text
    assert 'pk::i64 sa = static_cast<pk::i64>(arg_int(args_, "sa"));' in text
    assert "pk::gemm(A, B, C, pk::GemmParams{batch, M, N, K, ta != 0, tb != 0, sa, sb, sc, beta});" in text
    assert 'arg_ptr(args_, "idx", "int32_t", true)' in text and 'arg_ptr(args_, "idx", "int64_t", false)' in text
    assert "arg_ret(args_, static_cast<double>(pk::embedding_fwd(" in text
    assert '{"max_pool2d_fwd", call_max_pool2d_fwd},' in text


def test_structs_with_arrays_and_nested_structs_are_packed():
    from pockengine.ops.kernels import driver_source
    text = shim_source(["reduce_sum", "sdpa_bwd", "strided_copy_uint8_t"])
    assert ("void shim_reduce_sum(const float* x, float* y, int ndim, const pk::i64* shape, const uint8_t* reduce, "
            "float scale) { pk::reduce_sum(x, y, pack_Reduce(ndim, shape, reduce, scale)); }") in text
    assert "for (int d = 0; reduce && d < ndim && d < pk::kMaxDims; ++d) s_.reduce[d] = reduce[d] != 0;" in text
    assert "s_.q.sb = q_sb;" in text and "s_.causal = causal != 0;" in text
    assert "pk::strided_copy<uint8_t>(x, y, pack_StridedCopy(" in text
    assert text.count("pk::SdpaParams pack_SdpaParams(") == 1
    sig = signatures()["sdpa_fwd"]
    assert argtypes(sig)[0][6:] == [ctypes.c_int64] * 5 + [ctypes.c_float, ctypes.c_int, ctypes.c_int] + [ctypes.c_int64] * 17
    drv = driver_source(["sdpa_fwd", "sgd_update"])
    # a member or parameter declared with a default may be left out of a case
    assert 'pk::i64 H = arg_has(args_, "H") ? static_cast<pk::i64>(arg_int(args_, "H")) : static_cast<pk::i64>(1);' in drv
    assert 'pk::i64 q_sr = arg_has(args_, "q_sr") ?' in drv and 'int check_finite = arg_has(args_, "check_finite") ?' in drv
    assert 'pk::i64 B = static_cast<pk::i64>(arg_int(args_, "B"));' in drv
