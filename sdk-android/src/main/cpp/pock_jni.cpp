// pock_jni.cpp — the JNI layer of the Kotlin SDK: ai.pockengine.PockNative over
// pock.h, and nothing else.  It is compiled into the model's own library
// (libpock_<name>.so) beside the generated model TU and the runtime.
//
// Rules kept here:
//  * every failing pock_* call becomes an ai.pockengine.PockException(status,
//    pock_last_error()); no C++ exception and no crash crosses into the VM;
//  * tensor data is never copied here: primitive arrays are pinned with
//    GetPrimitiveArrayCritical (released right after the call, JNI_ABORT for
//    inputs) and direct ByteBuffers are read in place, so the only copy is the
//    runtime's copy into the arena.  No other JNI call runs while arrays are
//    pinned; the Kotlin side (PockTrainer) has already checked dtypes and
//    shapes, and this file re-checks every size before touching memory.
#include <jni.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "pock.h"

#define POCK_JNI(ret, name) extern "C" JNIEXPORT ret JNICALL Java_ai_pockengine_PockNative_##name

namespace {

jclass g_exception = nullptr;      // ai.pockengine.PockException
jmethodID g_exception_ctor = nullptr;  // PockException(int, String)
jclass g_array_class[4] = {};      // float[], long[], int[], byte[] by pock_dtype

void throw_pock(JNIEnv* env, int status, const std::string& message) {
  if (env->ExceptionCheck()) return;  // keep the first pending exception
  if (!g_exception) {                 // JNI_OnLoad could not resolve the class: still fail loudly
    jclass rt = env->FindClass("java/lang/RuntimeException");
    if (rt) env->ThrowNew(rt, message.c_str());
    return;
  }
  jstring msg = env->NewStringUTF(message.c_str());
  if (!msg) return;  // OutOfMemoryError pending
  jobject ex = env->NewObject(g_exception, g_exception_ctor, static_cast<jint>(status), msg);
  if (ex) env->Throw(static_cast<jthrowable>(ex));
}

// Throw for a failed status; returns true when it threw.
bool failed(JNIEnv* env, pock_status s) {
  if (s == POCK_OK) return false;
  const char* why = pock_last_error();
  throw_pock(env, s, why && *why ? why : "unknown error");
  return true;
}

pock_trainer* trainer(jlong handle) { return reinterpret_cast<pock_trainer*>(static_cast<intptr_t>(handle)); }

int64_t element_size(int32_t dtype) {
  switch (dtype) {
    case POCK_F32: case POCK_I32: return 4;
    case POCK_I64: return 8;
    case POCK_U8: return 1;
    default: return 0;
  }
}

// One tensor argument: a direct buffer's address, or an array to pin.
struct Arg {
  jarray array = nullptr;   // null for a direct buffer
  uint8_t* address = nullptr;
  int64_t offset = 0;
  int64_t nbytes = 0;
};

// Resolve data[i] (primitive array or direct ByteBuffer) for nbytes bytes of
// dtype from byte offset; throws and returns false when it does not fit.
bool resolve(JNIEnv* env, jobjectArray data, jsize i, int32_t dtype, int64_t offset, int64_t nbytes,
             const char* role, Arg* out) {
  jobject obj = env->GetObjectArrayElement(data, i);
  if (!obj) {
    throw_pock(env, POCK_ERR_INVALID_ARGUMENT, std::string(role) + " " + std::to_string(i) + ": data is null");
    return false;
  }
  out->offset = offset;
  out->nbytes = nbytes;
  if (void* addr = env->GetDirectBufferAddress(obj)) {
    const int64_t capacity = env->GetDirectBufferCapacity(obj);
    if (offset < 0 || offset + nbytes > capacity) {
      throw_pock(env, POCK_ERR_SHAPE, std::string(role) + " " + std::to_string(i) + ": direct buffer holds " +
                                          std::to_string(capacity - offset) + " bytes from its position, needs " +
                                          std::to_string(nbytes));
      return false;
    }
    out->address = static_cast<uint8_t*>(addr);
    return true;
  }
  const int64_t esize = element_size(dtype);
  if (esize == 0 || !env->IsInstanceOf(obj, g_array_class[dtype])) {
    throw_pock(env, POCK_ERR_DTYPE, std::string(role) + " " + std::to_string(i) +
                                        ": data is neither a direct ByteBuffer nor an array of pock_dtype " +
                                        std::to_string(dtype));
    return false;
  }
  out->array = static_cast<jarray>(obj);
  const int64_t have = static_cast<int64_t>(env->GetArrayLength(out->array)) * esize;
  if (offset != 0 || nbytes > have) {
    throw_pock(env, POCK_ERR_SHAPE, std::string(role) + " " + std::to_string(i) + ": array holds " +
                                        std::to_string(have) + " bytes, needs " + std::to_string(nbytes));
    return false;
  }
  return true;
}

// Arrays pinned for the duration of one pock.h call, released by the destructor
// (inputs with JNI_ABORT: nothing to copy back; outputs with 0: commit).
class Pins {
 public:
  explicit Pins(JNIEnv* env) : env_(env) {}
  Pins(const Pins&) = delete;
  Pins& operator=(const Pins&) = delete;
  ~Pins() {
    for (size_t i = held_.size(); i-- > 0;)
      env_->ReleasePrimitiveArrayCritical(held_[i].first->array, held_[i].first->address, held_[i].second);
  }
  // Pin every array in args; false (with nothing more pinned) when the VM refuses.
  bool pin(std::vector<Arg>& args, jint release_mode) {
    for (Arg& a : args) {
      if (!a.array) continue;
      a.address = static_cast<uint8_t*>(env_->GetPrimitiveArrayCritical(a.array, nullptr));
      if (!a.address) return false;
      held_.emplace_back(&a, release_mode);
    }
    return true;
  }

 private:
  JNIEnv* env_;
  std::vector<std::pair<Arg*, jint>> held_;
};

// The tensors of a step/forward call, read from PockNative's parallel arrays.
struct Tensors {
  std::vector<int32_t> dtypes, ndims;
  std::vector<int64_t> offsets, dims;
  std::vector<Arg> args;
  std::vector<pock_tensor> tensors;  // filled by view() once every array is pinned

  bool read(JNIEnv* env, jobjectArray data, jlongArray offs, jintArray dts, jintArray nds, jlongArray dms) {
    const jsize n = env->GetArrayLength(data);
    if (env->GetArrayLength(offs) != n || env->GetArrayLength(dts) != n || env->GetArrayLength(nds) != n) {
      throw_pock(env, POCK_ERR_INTERNAL, "PockNative: tensor argument arrays differ in length");
      return false;
    }
    dtypes.resize(n), ndims.resize(n), offsets.resize(n), args.resize(n);
    env->GetIntArrayRegion(dts, 0, n, reinterpret_cast<jint*>(dtypes.data()));
    env->GetIntArrayRegion(nds, 0, n, reinterpret_cast<jint*>(ndims.data()));
    env->GetLongArrayRegion(offs, 0, n, reinterpret_cast<jlong*>(offsets.data()));
    dims.resize(env->GetArrayLength(dms));
    env->GetLongArrayRegion(dms, 0, static_cast<jsize>(dims.size()), reinterpret_cast<jlong*>(dims.data()));
    size_t k = 0;
    for (jsize i = 0; i < n; ++i) {
      if (ndims[i] < 0 || ndims[i] > POCK_MAX_DIMS || k + ndims[i] > dims.size()) {
        throw_pock(env, POCK_ERR_INTERNAL, "PockNative: bad dims for tensor " + std::to_string(i));
        return false;
      }
      int64_t nbytes = element_size(dtypes[i]);
      for (int32_t d = 0; d < ndims[i]; ++d) nbytes *= dims[k + d];
      k += ndims[i];
      if (!resolve(env, data, i, dtypes[i], offsets[i], nbytes, "tensor", &args[i])) return false;
    }
    return true;
  }

  void view() {
    tensors.resize(args.size());
    size_t k = 0;
    for (size_t i = 0; i < args.size(); ++i) {
      tensors[i] = pock_tensor{args[i].address + args[i].offset, dtypes[i], ndims[i], dims.data() + k};
      k += ndims[i];
    }
  }
};

}  // namespace

extern "C" JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM* vm, void*) {
  JNIEnv* env = nullptr;
  if (vm->GetEnv(reinterpret_cast<void**>(&env), JNI_VERSION_1_6) != JNI_OK) return JNI_ERR;
  jclass cls = env->FindClass("ai/pockengine/PockException");
  if (!cls) return JNI_ERR;
  g_exception = static_cast<jclass>(env->NewGlobalRef(cls));
  g_exception_ctor = env->GetMethodID(cls, "<init>", "(ILjava/lang/String;)V");
  if (!g_exception_ctor) return JNI_ERR;
  const char* arrays[4] = {"[F", "[J", "[I", "[B"};  // indexed by pock_dtype
  for (int i = 0; i < 4; ++i) {
    jclass a = env->FindClass(arrays[i]);
    if (!a) return JNI_ERR;
    g_array_class[i] = static_cast<jclass>(env->NewGlobalRef(a));
  }
  return JNI_VERSION_1_6;
}

POCK_JNI(jstring, version)(JNIEnv* env, jclass) { return env->NewStringUTF(pock_version()); }
POCK_JNI(jstring, modelName)(JNIEnv* env, jclass) { return env->NewStringUTF(pock_model_name()); }
POCK_JNI(jstring, modelHash)(JNIEnv* env, jclass) { return env->NewStringUTF(pock_model_hash()); }

POCK_JNI(jlong, open)(JNIEnv* env, jclass, jstring checkpoint) {
  const char* path = checkpoint ? env->GetStringUTFChars(checkpoint, nullptr) : nullptr;
  if (checkpoint && !path) return 0;  // OutOfMemoryError pending
  pock_trainer* t = nullptr;
  pock_status s = pock_open(path, &t);
  std::string why = s == POCK_OK ? "" : pock_last_error();
  if (path) env->ReleaseStringUTFChars(checkpoint, path);
  if (s != POCK_OK) {
    throw_pock(env, s, why);
    return 0;
  }
  return static_cast<jlong>(reinterpret_cast<intptr_t>(t));
}

POCK_JNI(void, close)(JNIEnv*, jclass, jlong handle) { pock_close(trainer(handle)); }

POCK_JNI(jfloat, step)(JNIEnv* env, jclass, jlong handle, jobjectArray data, jlongArray offsets, jintArray dtypes,
                       jintArray ndims, jlongArray dims, jint n_inputs, jobjectArray nonfinite) {
  Tensors in;
  if (!in.read(env, data, offsets, dtypes, ndims, dims)) return 0.0f;
  const int32_t n = static_cast<int32_t>(in.args.size());
  if (n_inputs < 0 || n_inputs > n) {
    throw_pock(env, POCK_ERR_INTERNAL, "PockNative.step: bad input count");
    return 0.0f;
  }
  float loss = 0.0f;
  pock_status s;
  std::string why;
  {
    Pins pins(env);
    if (!pins.pin(in.args, JNI_ABORT)) {
      s = POCK_ERR_NO_MEMORY, why = "step: the VM could not pin an input array";
    } else {
      in.view();
      s = pock_step(trainer(handle), in.tensors.data(), n_inputs, in.tensors.data() + n_inputs, n - n_inputs, &loss);
      if (s != POCK_OK) why = pock_last_error();
    }
  }  // unpinned before any JNI call that may throw
  if ((s == POCK_ERR_NONFINITE || s == POCK_ERR_NO_TARGETS) && nonfinite && env->GetArrayLength(nonfinite) > 0) {
    // skipped, not failed: the Kotlin side counts it (or throws when strict and non-finite);
    // nonfinite[1], when there, says which: "NONFINITE" or "NO_TARGETS" (every label ignored)
    jstring msg = env->NewStringUTF(why.c_str());
    if (msg) env->SetObjectArrayElement(nonfinite, 0, msg);
    if (env->GetArrayLength(nonfinite) > 1) {
      jstring kind = env->NewStringUTF(s == POCK_ERR_NO_TARGETS ? "NO_TARGETS" : "NONFINITE");
      if (kind) env->SetObjectArrayElement(nonfinite, 1, kind);
    }
    return loss;
  }
  if (s != POCK_OK) throw_pock(env, s, why);
  return loss;
}

POCK_JNI(void, forward)(JNIEnv* env, jclass, jlong handle, jobjectArray data, jlongArray offsets, jintArray dtypes,
                        jintArray ndims, jlongArray dims, jobjectArray out_data, jlongArray out_offsets,
                        jlongArray out_bytes) {
  Tensors in;
  if (!in.read(env, data, offsets, dtypes, ndims, dims)) return;
  const jsize n_out = env->GetArrayLength(out_data);
  if (env->GetArrayLength(out_offsets) != n_out || env->GetArrayLength(out_bytes) != n_out) {
    throw_pock(env, POCK_ERR_INTERNAL, "PockNative.forward: output argument arrays differ in length");
    return;
  }
  std::vector<int64_t> offs(n_out), bytes(n_out);
  env->GetLongArrayRegion(out_offsets, 0, n_out, reinterpret_cast<jlong*>(offs.data()));
  env->GetLongArrayRegion(out_bytes, 0, n_out, reinterpret_cast<jlong*>(bytes.data()));
  std::vector<Arg> outs(n_out);
  for (jsize i = 0; i < n_out; ++i) {
    // Outputs are float32 or int64 arrays; the byte count decides, so accept any primitive array kind.
    jobject obj = env->GetObjectArrayElement(out_data, i);
    int32_t dtype = POCK_U8;
    for (int32_t d : {POCK_F32, POCK_I64, POCK_I32, POCK_U8})
      if (obj && env->IsInstanceOf(obj, g_array_class[d])) dtype = d;
    if (!resolve(env, out_data, i, dtype, offs[i], bytes[i], "output", &outs[i])) return;
  }
  pock_status s;
  std::string why;
  {
    Pins pins(env);
    if (!pins.pin(in.args, JNI_ABORT) || !pins.pin(outs, 0)) {
      s = POCK_ERR_NO_MEMORY, why = "forward: the VM could not pin an array";
    } else {
      in.view();
      std::vector<pock_buffer> buffers(n_out);
      for (jsize i = 0; i < n_out; ++i) buffers[i] = pock_buffer{outs[i].address + outs[i].offset, outs[i].nbytes};
      s = pock_forward(trainer(handle), in.tensors.data(), static_cast<int32_t>(in.tensors.size()), buffers.data(),
                       n_out);
      if (s != POCK_OK) why = pock_last_error();
    }
  }
  if (s != POCK_OK) throw_pock(env, s, why);
}

static void with_path(JNIEnv* env, jstring path, pock_status (*call)(pock_trainer*, const char*), jlong handle) {
  const char* p = env->GetStringUTFChars(path, nullptr);
  if (!p) return;
  pock_status s = call(trainer(handle), p);
  std::string why = s == POCK_OK ? "" : pock_last_error();
  env->ReleaseStringUTFChars(path, p);
  if (s != POCK_OK) throw_pock(env, s, why);
}

POCK_JNI(void, save)(JNIEnv* env, jclass, jlong handle, jstring path) { with_path(env, path, pock_save, handle); }
POCK_JNI(void, load)(JNIEnv* env, jclass, jlong handle, jstring path) { with_path(env, path, pock_load, handle); }

POCK_JNI(jfloat, getLearningRate)(JNIEnv* env, jclass, jlong handle) {
  float lr = 0.0f;
  failed(env, pock_get_learning_rate(trainer(handle), &lr));
  return lr;
}

POCK_JNI(void, setLearningRate)(JNIEnv* env, jclass, jlong handle, jfloat lr) {
  failed(env, pock_set_learning_rate(trainer(handle), lr));
}

POCK_JNI(jlong, stepCount)(JNIEnv* env, jclass, jlong handle) {
  int64_t steps = 0;
  failed(env, pock_step_count(trainer(handle), &steps));
  return static_cast<jlong>(steps);
}

POCK_JNI(void, setNumThreads)(JNIEnv* env, jclass, jlong handle, jint n) {
  failed(env, pock_set_num_threads(trainer(handle), n));
}

// [dtype, ndim, dims...] of compiled tensor `index` of `group` (pock_io_info), or null past the
// last: what ModelBundle checks the manifest against (the library is the truth).
POCK_JNI(jlongArray, ioInfo)(JNIEnv* env, jclass, jint group, jint index) {
  pock_tensor_info info;
  if (index < 0 || index >= pock_io_count(group) || pock_io_info(group, index, &info) != POCK_OK) return nullptr;
  if (info.ndim < 0 || info.ndim > POCK_MAX_DIMS) return nullptr;
  jlong v[2 + POCK_MAX_DIMS];
  v[0] = info.dtype;
  v[1] = info.ndim;
  for (int32_t d = 0; d < info.ndim; ++d) v[2 + d] = static_cast<jlong>(info.shape[d]);
  jlongArray out = env->NewLongArray(2 + info.ndim);
  if (out) env->SetLongArrayRegion(out, 0, 2 + info.ndim, v);
  return out;
}

// ---------------------------------------------------------------- state tensors, trained-only saves, profiling

// The pock_dtype of a primitive array object (for its element size), or POCK_U8 (bytes) when unknown.
static int32_t array_dtype(JNIEnv* env, jobject obj) {
  for (int32_t d : {POCK_F32, POCK_I64, POCK_I32, POCK_U8})
    if (obj && env->IsInstanceOf(obj, g_array_class[d])) return d;
  return POCK_U8;
}

// `copy` (pock_get_tensor when into, else pock_set_tensor) on `data` (array or direct buffer).
using TensorCopy = pock_status (*)(pock_trainer*, const char*, uint8_t*, int64_t);
static void tensor_copy(JNIEnv* env, jlong handle, jstring name, jobject data, jlong offset, jlong nbytes, bool into,
                        TensorCopy copy) {
  const char* n = env->GetStringUTFChars(name, nullptr);
  if (!n) return;
  const std::string key(n);
  env->ReleaseStringUTFChars(name, n);
  jobjectArray one = env->NewObjectArray(1, env->FindClass("java/lang/Object"), data);
  if (!one) return;
  std::vector<Arg> args(1);
  if (!resolve(env, one, 0, array_dtype(env, data), offset, nbytes, into ? "getTensor" : "setTensor", &args[0]))
    return;
  pock_status s;
  std::string why;
  {
    Pins pins(env);
    if (!pins.pin(args, into ? 0 : JNI_ABORT)) {
      s = POCK_ERR_NO_MEMORY, why = "the VM could not pin the tensor's array";
    } else {
      uint8_t* p = args[0].address + args[0].offset;
      s = copy(trainer(handle), key.c_str(), p, nbytes);
      if (s != POCK_OK) why = pock_last_error();
    }
  }
  if (s != POCK_OK) throw_pock(env, s, why);
}

POCK_JNI(void, getTensor)(JNIEnv* env, jclass, jlong handle, jstring name, jobject data, jlong offset, jlong nbytes) {
  tensor_copy(env, handle, name, data, offset, nbytes, true,
              [](pock_trainer* t, const char* n, uint8_t* p, int64_t b) { return pock_get_tensor(t, n, p, b); });
}

POCK_JNI(void, setTensor)(JNIEnv* env, jclass, jlong handle, jstring name, jobject data, jlong offset, jlong nbytes) {
  tensor_copy(env, handle, name, data, offset, nbytes, false,
              [](pock_trainer* t, const char* n, uint8_t* p, int64_t b) { return pock_set_tensor(t, n, p, b); });
}

POCK_JNI(jint, tensorCount)(JNIEnv*, jclass) { return pock_tensor_count(); }

POCK_JNI(jstring, tensorName)(JNIEnv* env, jclass, jint index) {
  pock_tensor_info info;
  if (failed(env, pock_tensor_info_at(index, &info))) return nullptr;
  return env->NewStringUTF(info.name);
}

POCK_JNI(jlongArray, tensorInfo)(JNIEnv* env, jclass, jint index) {
  pock_tensor_info info;
  if (failed(env, pock_tensor_info_at(index, &info))) return nullptr;
  const int32_t ndim = info.ndim < 0 ? 0 : (info.ndim > POCK_MAX_DIMS ? POCK_MAX_DIMS : info.ndim);
  std::vector<jlong> v = {info.dtype, ndim, info.kind, info.nbytes};
  for (int32_t d = 0; d < ndim; ++d) v.push_back(info.shape[d]);
  jlongArray out = env->NewLongArray(static_cast<jsize>(v.size()));
  if (out) env->SetLongArrayRegion(out, 0, static_cast<jsize>(v.size()), v.data());
  return out;
}

POCK_JNI(void, saveTrained)(JNIEnv* env, jclass, jlong handle, jstring path) {
  with_path(env, path, pock_save_trained, handle);
}

POCK_JNI(void, profileEnable)(JNIEnv* env, jclass, jlong handle, jboolean on) {
  failed(env, pock_profile_enable(trainer(handle), on ? 1 : 0));
}

POCK_JNI(void, profileReset)(JNIEnv* env, jclass, jlong handle) { failed(env, pock_profile_reset(trainer(handle))); }

POCK_JNI(jint, profileCount)(JNIEnv*, jclass, jlong handle) { return pock_profile_count(trainer(handle)); }

POCK_JNI(jobjectArray, profileEntry)(JNIEnv* env, jclass, jlong handle, jint index, jlongArray counts) {
  pock_node_profile e;
  if (failed(env, pock_profile_entry(trainer(handle), index, &e))) return nullptr;
  if (env->GetArrayLength(counts) < 4) {
    throw_pock(env, POCK_ERR_INTERNAL, "PockNative.profileEntry: counts needs 4 slots");
    return nullptr;
  }
  const jlong c[4] = {e.index, e.flops, e.steps, e.total_ns};
  env->SetLongArrayRegion(counts, 0, 4, c);
  jobjectArray out = env->NewObjectArray(4, env->FindClass("java/lang/String"), nullptr);
  if (!out) return nullptr;
  const char* parts[4] = {e.phase, e.op, e.kernel, e.module};
  for (jsize i = 0; i < 4; ++i) {
    jstring s = env->NewStringUTF(parts[i] ? parts[i] : "");
    if (!s) return nullptr;
    env->SetObjectArrayElement(out, i, s);
    env->DeleteLocalRef(s);
  }
  return out;
}

// ---- PockTokenizer (issue 37) ----------------------------------------------------
// ai.pockengine.PockTokenizerNative over pock.h's pock_tokenizer_*: text crosses as
// UTF-8 bytes (Kotlin encodes/decodes), ids as int[]; failures throw PockException.
#define POCK_TOK_JNI(ret, name) extern "C" JNIEXPORT ret JNICALL Java_ai_pockengine_PockTokenizerNative_##name

namespace {
pock_tokenizer* tokenizer(jlong handle) { return reinterpret_cast<pock_tokenizer*>(static_cast<intptr_t>(handle)); }

jlong opened_tokenizer(JNIEnv* env, pock_status s, pock_tokenizer* t) {
  if (failed(env, s)) return 0;
  return static_cast<jlong>(reinterpret_cast<intptr_t>(t));
}
}  // namespace

POCK_TOK_JNI(jlong, open)(JNIEnv* env, jclass, jstring path) {
  const char* p = env->GetStringUTFChars(path, nullptr);
  if (!p) return 0;
  pock_tokenizer* t = nullptr;
  const pock_status s = pock_tokenizer_open(p, &t);
  env->ReleaseStringUTFChars(path, p);
  return opened_tokenizer(env, s, t);
}

POCK_TOK_JNI(jlong, openBytes)(JNIEnv* env, jclass, jbyteArray data) {
  const jsize n = env->GetArrayLength(data);
  std::vector<jbyte> bytes(static_cast<size_t>(n));
  if (n) env->GetByteArrayRegion(data, 0, n, bytes.data());
  pock_tokenizer* t = nullptr;
  return opened_tokenizer(env, pock_tokenizer_open_memory(bytes.data(), n, &t), t);
}

POCK_TOK_JNI(void, close)(JNIEnv*, jclass, jlong handle) { pock_tokenizer_close(tokenizer(handle)); }

POCK_TOK_JNI(jintArray, encode)(JNIEnv* env, jclass, jlong handle, jbyteArray utf8, jboolean special) {
  const jsize n = env->GetArrayLength(utf8);
  std::vector<char> text(static_cast<size_t>(n));
  if (n) env->GetByteArrayRegion(utf8, 0, n, reinterpret_cast<jbyte*>(text.data()));
  const int32_t* ids = nullptr;
  int64_t count = 0;
  if (failed(env, pock_tokenizer_encode(tokenizer(handle), text.data(), n, special ? 1 : 0, &ids, &count))) return nullptr;
  if (count > INT32_MAX) {
    throw_pock(env, POCK_ERR_VALUE, "encode: more than 2^31 ids");
    return nullptr;
  }
  jintArray out = env->NewIntArray(static_cast<jsize>(count));
  if (out && count) env->SetIntArrayRegion(out, 0, static_cast<jsize>(count), reinterpret_cast<const jint*>(ids));
  return out;
}

POCK_TOK_JNI(jbyteArray, decode)(JNIEnv* env, jclass, jlong handle, jintArray ids, jboolean skipSpecial) {
  const jsize n = env->GetArrayLength(ids);
  std::vector<int32_t> v(static_cast<size_t>(n));
  if (n) env->GetIntArrayRegion(ids, 0, n, reinterpret_cast<jint*>(v.data()));
  const char* text = nullptr;
  int64_t nbytes = 0;
  if (failed(env, pock_tokenizer_decode(tokenizer(handle), v.data(), n, skipSpecial ? 1 : 0, &text, &nbytes)))
    return nullptr;
  if (nbytes > INT32_MAX) {
    throw_pock(env, POCK_ERR_VALUE, "decode: text over 2 GiB");
    return nullptr;
  }
  jbyteArray out = env->NewByteArray(static_cast<jsize>(nbytes));
  if (out && nbytes) env->SetByteArrayRegion(out, 0, static_cast<jsize>(nbytes), reinterpret_cast<const jbyte*>(text));
  return out;
}

// {vocab size, bos, eos, pad} (-1 for none)
POCK_TOK_JNI(jintArray, info)(JNIEnv* env, jclass, jlong handle) {
  int32_t v[4] = {0, -1, -1, -1};
  if (failed(env, pock_tokenizer_vocab_size(tokenizer(handle), &v[0]))) return nullptr;
  if (failed(env, pock_tokenizer_special_ids(tokenizer(handle), &v[1], &v[2], &v[3]))) return nullptr;
  jintArray out = env->NewIntArray(4);
  if (out) env->SetIntArrayRegion(out, 0, 4, reinterpret_cast<const jint*>(v));
  return out;
}

POCK_TOK_JNI(jint, tokenToId)(JNIEnv* env, jclass, jlong handle, jbyteArray utf8) {
  const jsize n = env->GetArrayLength(utf8);
  std::vector<char> text(static_cast<size_t>(n));
  if (n) env->GetByteArrayRegion(utf8, 0, n, reinterpret_cast<jbyte*>(text.data()));
  int32_t id = -1;
  failed(env, pock_tokenizer_token_to_id(tokenizer(handle), text.data(), n, &id));
  return id;
}
// ---- end PockTokenizer -----------------------------------------------------------

// ---- generation and adapters out (issue 37) --------------------------------------
// PockNative.generate over pock_generate: the prompt and stop ids cross as int[] (copied into
// the int64 ids pock.h takes), the new ids come back as int[].  The listener (nullable) is
// called on this thread from the decode loop through a C callback: a true return stops after
// that token; an exception it throws stops generation too and is the one that reaches Kotlin.
namespace {
struct TokenSink {
  JNIEnv* env;
  jobject listener;
  jmethodID on_token;
};

int32_t call_listener(int64_t token, void* user) {
  auto* sink = static_cast<TokenSink*>(user);
  if (sink->env->ExceptionCheck()) return 1;
  const jboolean stop = sink->env->CallBooleanMethod(sink->listener, sink->on_token, static_cast<jlong>(token));
  return sink->env->ExceptionCheck() || stop ? 1 : 0;
}

std::vector<int64_t> ids_of(JNIEnv* env, jintArray ids) {
  const jsize n = env->GetArrayLength(ids);
  std::vector<jint> v(static_cast<size_t>(n));
  if (n) env->GetIntArrayRegion(ids, 0, n, v.data());
  return std::vector<int64_t>(v.begin(), v.end());
}
}  // namespace

POCK_JNI(jboolean, generateSupported)(JNIEnv*, jclass) { return pock_generate_supported() ? JNI_TRUE : JNI_FALSE; }

POCK_JNI(jintArray, generate)(JNIEnv* env, jclass, jlong handle, jintArray prompt, jint max_new_tokens,
                              jfloat temperature, jint top_k, jfloat top_p, jlong seed, jintArray stop,
                              jobject listener) {
  if (!prompt || !stop) {
    throw_pock(env, POCK_ERR_INVALID_ARGUMENT, "generate: the prompt and stop ids must not be null");
    return nullptr;
  }
  const std::vector<int64_t> ids = ids_of(env, prompt), stops = ids_of(env, stop);
  pock_generate_options o;
  pock_generate_default_options(&o);
  o.max_new_tokens = max_new_tokens;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = static_cast<uint64_t>(seed);
  o.stop_ids = stops.empty() ? nullptr : stops.data();
  o.n_stop = static_cast<int32_t>(stops.size());
  TokenSink sink{env, listener, nullptr};
  if (listener) {
    jclass cls = env->GetObjectClass(listener);
    sink.on_token = cls ? env->GetMethodID(cls, "onToken", "(J)Z") : nullptr;
    if (!sink.on_token) return nullptr;  // NoSuchMethodError pending
    o.callback = call_listener;
    o.user_data = &sink;
  }
  // calloc: pages are touched only as ids are written, so a max_new_tokens far past the
  // model's context is refused by pock_generate (naming it), not by the allocator
  const size_t capacity = static_cast<size_t>(max_new_tokens > 0 ? max_new_tokens : 1);
  int64_t* out = static_cast<int64_t*>(std::calloc(capacity, sizeof(int64_t)));
  if (!out) {
    throw_pock(env, POCK_ERR_NO_MEMORY, "generate: no memory for max_new_tokens " + std::to_string(max_new_tokens) +
                                            " ids");
    return nullptr;
  }
  int32_t n_out = 0;
  const pock_status s = pock_generate(trainer(handle), ids.data(), static_cast<int32_t>(ids.size()), &o, out,
                                      static_cast<int32_t>(capacity), &n_out);
  std::vector<jint> got(out, out + (s == POCK_OK ? n_out : 0));
  std::free(out);
  if (env->ExceptionCheck()) return nullptr;  // the listener threw: that exception goes up
  if (failed(env, s)) return nullptr;
  jintArray result = env->NewIntArray(static_cast<jsize>(got.size()));
  if (result && !got.empty()) env->SetIntArrayRegion(result, 0, static_cast<jsize>(got.size()), got.data());
  return result;
}

POCK_JNI(void, exportAdapter)(JNIEnv* env, jclass, jlong handle, jstring path, jstring format) {
  const char* p = env->GetStringUTFChars(path, nullptr);
  if (!p) return;
  const char* f = env->GetStringUTFChars(format, nullptr);
  if (!f) {
    env->ReleaseStringUTFChars(path, p);
    return;
  }
  const pock_status s = pock_export_adapter(trainer(handle), p, f);
  const std::string why = s == POCK_OK ? "" : pock_last_error();
  env->ReleaseStringUTFChars(format, f);
  env->ReleaseStringUTFChars(path, p);
  if (s != POCK_OK) throw_pock(env, s, why);
}
// ---- end generation and adapters out ---------------------------------------------
