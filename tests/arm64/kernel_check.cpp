// kernel_check.cpp — runs PockEngine's kernels on inputs written by
// test_arm64.py and writes their outputs back, for checking against torch.
// Built for aarch64 and run under qemu; it also builds and runs on the host.
// Link it with the generated calls (python -c "from pockengine.ops.kernels
// import *; print(driver_source(driver_kernels()))" > calls.cpp).
//
//   kernel_check IN OUT
//
// Both files are a list of tensors until end of file, little-endian:
//   u32 name length, name bytes, u32 ndim, i64 shape[ndim], f32 data[numel]
// A tensor named "<case>/<arg>" belongs to test case <case>; the case's kernel
// family is the part of <case> before the first '.' ("binary.3" -> "binary").
// For a hand-written runner, "<case>/p" holds its scalar parameters (sizes, flags, hyper-parameters) as
// floats.  Integer tensors (targets, masks) travel as floats too.  Outputs are
// written as "<case>/<name>".  Exit status 0 unless a file or a case is bad.
//
// A case whose family is a kernel's name ("softmax_fwd.2") calls that kernel
// alone, or kernels joined by '+' ("lstm_fwd+lstm_bwd.0") in order, each
// call's outputs the next one's buffers, through pock_call(), generated from
// pock_kernels.h by pockengine.ops.kernels.driver_source: each
// parameter is the case's tensor of its name (a scalar: one element; a pointer:
// the buffer, nullptr when absent; a writable one starts as the input given and
// is written back as an output), a struct's fields by their names, and a
// kernel's return value is the output "ret"; a `void*` parameter's buffer is
// named "<param>:<element type>" ("w:uint16_t").  The runners below are the
// families not yet written as such cases.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "pock_kernels.h"

using pk::i64;

namespace {

struct Tensor {
  std::vector<i64> shape;
  std::vector<float> data;
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "kernel_check: %s\n", msg.c_str());
  std::exit(2);
}

std::vector<std::pair<std::string, Tensor>> read_file(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (!f) die(std::string("cannot open ") + path);
  std::vector<std::pair<std::string, Tensor>> out;
  uint32_t len;
  while (std::fread(&len, 4, 1, f) == 1) {
    std::string name(len, '\0');
    uint32_t ndim;
    Tensor t;
    bool ok = std::fread(&name[0], 1, len, f) == len && std::fread(&ndim, 4, 1, f) == 1 && ndim <= 8;
    t.shape.resize(ok ? ndim : 0);
    ok = ok && std::fread(t.shape.data(), 8, ndim, f) == ndim;
    i64 n = 1;
    for (i64 d : t.shape) n *= d;
    t.data.resize(ok ? n : 0);
    if (!ok || std::fread(t.data.data(), 4, n, f) != static_cast<size_t>(n)) die("truncated input at " + name);
    out.emplace_back(name, std::move(t));
  }
  std::fclose(f);
  return out;
}

// One test case: its inputs by argument name, its outputs in order.
struct Case {
  std::string name;
  std::map<std::string, Tensor> in;
  std::map<std::string, Tensor> out;  // map nodes never move: output pointers stay valid

  const Tensor& get(const std::string& arg) const {
    auto it = in.find(arg);
    if (it == in.end()) die(name + ": missing input " + arg);
    return it->second;
  }
  bool has(const std::string& arg) const { return in.count(arg) != 0; }
  const float* f(const std::string& arg) const { return get(arg).data.data(); }
  const float* opt(const std::string& arg) const { return has(arg) ? f(arg) : nullptr; }
  float pf(size_t i) const {
    const Tensor& p = get("p");
    if (i >= p.data.size()) die(name + ": too few parameters");
    return p.data[i];
  }
  i64 pi(size_t i) const { return static_cast<i64>(pf(i)); }
  bool pb(size_t i) const { return pf(i) != 0.0f; }
  std::vector<uint8_t> bytes(const std::string& arg) const {
    const Tensor& t = get(arg);
    return std::vector<uint8_t>(t.data.begin(), t.data.end());
  }
  // A new output of the given shape, zero-filled (or a copy of input `init`).
  float* output(const std::string& oname, std::vector<i64> shape) {
    i64 n = 1;
    for (i64 d : shape) n *= d;
    Tensor& t = out[oname] = Tensor{std::move(shape), std::vector<float>(n, 0.0f)};
    return t.data.data();
  }
  float* output_from(const std::string& oname, const std::string& init) { return (out[oname] = get(init)).data.data(); }
};

}  // namespace

// ------------------------------------------------------------------ generated calls (pock_call)
struct Args {
  Case& c;
  std::map<std::string, std::vector<unsigned char>> bufs;  // converted non-float buffers
  std::vector<std::function<void()>> back;                // writable ones, written back after the call
};

namespace {
template <class T>
void* converted(Args& a, const std::string& name, bool writable) {
  const Tensor& t = a.c.get(name);
  std::vector<unsigned char>& buf = a.bufs[name];
  buf.assign(t.data.size() * sizeof(T), 0);
  T* p = reinterpret_cast<T*>(buf.data());
  for (size_t i = 0; i < t.data.size(); ++i) p[i] = static_cast<T>(t.data[i]);
  if (writable)
    a.back.push_back([&a, name, p, n = t.data.size(), shape = t.shape] {
      float* o = a.c.output(name, shape);
      for (size_t i = 0; i < n; ++i) o[i] = static_cast<float>(p[i]);
    });
  return p;
}
}  // namespace

void* arg_ptr(Args& a, const char* name, const char* type, bool writable) {
  std::string t = type;
  if (t == "void") {  // the case names the element type: its buffer is "<name>:<type>" ("w:uint16_t")
    for (auto& [key, tensor] : a.c.in)
      if (key.rfind(std::string(name) + ":", 0) == 0) {
        if (writable) die(a.c.name + ": a writable void* buffer " + name + " is not supported");
        return arg_ptr(a, key.c_str(), key.c_str() + std::strlen(name) + 1, false);
      }
    return nullptr;
  }
  if (!a.c.has(name)) return nullptr;
  if (t == "float") return writable ? a.c.output_from(name, name) : const_cast<float*>(a.c.f(name));
  if (t == "i64" || t == "int64_t") return converted<int64_t>(a, name, writable);
  if (t == "int32_t" || t == "int") return converted<int32_t>(a, name, writable);
  if (t == "uint8_t") return converted<uint8_t>(a, name, writable);
  if (t == "int8_t") return converted<int8_t>(a, name, writable);
  if (t == "uint16_t") return converted<uint16_t>(a, name, writable);
  if (t == "uint32_t") return converted<uint32_t>(a, name, writable);
  if (t == "uint64_t") return converted<uint64_t>(a, name, writable);
  if (t == "double") return converted<double>(a, name, writable);
  die(a.c.name + ": no buffer of element type " + t + " for " + name);
}

double arg_num(Args& a, const char* name) {
  const Tensor& t = a.c.get(name);
  if (t.data.size() != 1) die(a.c.name + ": scalar " + name + " has " + std::to_string(t.data.size()) + " elements");
  return t.data[0];
}

long long arg_int(Args& a, const char* name) { return static_cast<long long>(arg_num(a, name)); }

void arg_ret(Args& a, double value) { a.c.output("ret", {1})[0] = static_cast<float>(value); }

bool pock_call(const char* kernel, Args& a);  // generated

namespace {

// ------------------------------------------------------------------ kernels
// Each runner's comment: its parameters p, its inputs -> its outputs.











// p: B L S E Ev scale causal mask_kind mask_sb mask_sl mask_ss; q k v mask? dout -> out probs dq dk dv
void run_sdpa(Case& c) {
  pk::SdpaParams p{c.pi(0), c.pi(1), c.pi(2), c.pi(3), c.pi(4), c.pf(5), c.pb(6), static_cast<int>(c.pi(7)),
                   c.pi(8), c.pi(9), c.pi(10)};
  std::vector<uint8_t> bool_mask = p.mask_kind == 1 ? c.bytes("mask") : std::vector<uint8_t>();
  const void* mask = p.mask_kind == 1 ? static_cast<const void*>(bool_mask.data()) : c.opt("mask");
  float* probs = c.output("probs", {p.B, p.L, p.S});
  std::vector<float> scratch(p.L * p.S);
  pk::sdpa_fwd(c.f("q"), c.f("k"), c.f("v"), mask, c.output("out", {p.B, p.L, p.Ev}), probs, p);
  pk::sdpa_bwd(c.f("dout"), c.f("q"), c.f("k"), c.f("v"), probs, c.output("dq", {p.B, p.L, p.E}),
               c.output("dk", {p.B, p.S, p.E}), c.output("dv", {p.B, p.S, p.Ev}), scratch.data(), p);
}





// p: scale reduce[0..ndim); x -> y (the reduced dims kept as size 1)
void run_reduce_sum(Case& c) {
  const Tensor& x = c.get("x");
  pk::Reduce r{};
  r.ndim = static_cast<int>(x.shape.size());
  r.scale = c.pf(0);
  std::vector<i64> yshape;
  for (int d = 0; d < r.ndim; ++d) {
    r.shape[d] = x.shape[d];
    r.reduce[d] = c.pb(1 + d);
    yshape.push_back(r.reduce[d] ? 1 : x.shape[d]);
  }
  pk::reduce_sum(x.data.data(), c.output("y", yshape), r);
}

// p: ndim in_offset out_offset shape[ndim] in_strides[ndim] out_strides[ndim]; x y (initial) -> y
void run_strided_copy(Case& c) {
  pk::StridedCopy s{};
  s.ndim = static_cast<int>(c.pi(0));
  s.in_offset = c.pi(1);
  s.out_offset = c.pi(2);
  for (int d = 0; d < s.ndim; ++d) {
    s.shape[d] = c.pi(3 + d);
    s.in_strides[d] = c.pi(3 + s.ndim + d);
    s.out_strides[d] = c.pi(3 + 2 * s.ndim + d);
  }
  pk::strided_copy<float>(c.f("x"), c.output_from("y", "y"), s);
}



// p: op (pk::Binary order: add sub mul div); a b (numpy broadcasting) -> out
void run_binary(Case& c) {
  const Tensor &a = c.get("a"), &b = c.get("b");
  pk::Broadcast p{};
  p.ndim = static_cast<int>(std::max(a.shape.size(), b.shape.size()));
  std::vector<i64> shape(p.ndim, 1);
  for (int which = 0; which < 2; ++which) {  // right-aligned; stride 0 where broadcast
    const std::vector<i64>& s = which ? b.shape : a.shape;
    i64* strides = which ? p.sb : p.sa;
    i64 stride = 1;
    for (int d = p.ndim - 1, sd = static_cast<int>(s.size()) - 1; d >= 0; --d, --sd) {
      i64 size = sd >= 0 ? s[sd] : 1;
      strides[d] = size == 1 ? 0 : stride;
      stride *= size;
      if (size != 1) shape[d] = size;
    }
  }
  for (int d = 0; d < p.ndim; ++d) p.shape[d] = shape[d];
  pk::binary(static_cast<pk::Binary>(c.pi(0)), a.data.data(), b.data.data(), c.output("out", shape), p);
}



const std::map<std::string, std::function<void(Case&)>> kKernels = {
    {"sdpa", run_sdpa},     {"reduce_sum", run_reduce_sum},
    {"strided_copy", run_strided_copy}, {"binary", run_binary},
};

void write_tensor(FILE* f, const std::string& name, const Tensor& t) {
  uint32_t len = static_cast<uint32_t>(name.size()), ndim = static_cast<uint32_t>(t.shape.size());
  std::fwrite(&len, 4, 1, f);
  std::fwrite(name.data(), 1, len, f);
  std::fwrite(&ndim, 4, 1, f);
  std::fwrite(t.shape.data(), 8, ndim, f);
  std::fwrite(t.data.data(), 4, t.data.size(), f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) die("usage: kernel_check IN OUT");
  std::vector<Case> cases;
  std::map<std::string, size_t> index;
  for (auto& [name, t] : read_file(argv[1])) {
    size_t slash = name.find('/');
    if (slash == std::string::npos) die("tensor name without a case: " + name);
    std::string cname = name.substr(0, slash);
    if (!index.count(cname)) index[cname] = cases.size(), cases.push_back(Case{cname, {}, {}});
    cases[index[cname]].in[name.substr(slash + 1)] = std::move(t);
  }
  FILE* f = std::fopen(argv[2], "wb");
  if (!f) die(std::string("cannot write ") + argv[2]);
  for (Case& c : cases) {
    std::string family = c.name.substr(0, c.name.find('.'));
    auto it = kKernels.find(family);
    if (it != kKernels.end()) {
      it->second(c);
    } else {  // "k1+k2": each call's outputs are the next one's buffers
      for (size_t start = 0, end; start <= family.size(); start = end + 1) {
        end = std::min(family.find('+', start), family.size());
        Args a{c, {}, {}};
        if (!pock_call(family.substr(start, end - start).c_str(), a)) die("unknown kernel family in case " + c.name);
        for (auto& put : a.back) put();
        for (auto& [oname, t] : c.out) c.in[oname] = t;
      }
    }
    for (auto& [oname, t] : c.out) write_tensor(f, c.name + "/" + oname, t);
  }
  if (std::fclose(f) != 0) die(std::string("cannot write ") + argv[2]);
  std::printf("kernel_check: %zu cases\n", cases.size());
  return 0;
}
