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
// A tensor named "<case>/<arg>" belongs to test case <case>; the case calls the
// kernel named by the part of <case> before the first '.' ("softmax_fwd.2"), or
// the kernels joined by '+' ("lstm_fwd+lstm_bwd.0") in order, each call's
// outputs the next one's buffers, through pock_call(), generated from
// pock_kernels.h by pockengine.ops.kernels.driver_source.  Each parameter is the
// case's tensor of its name: a scalar one element (one the header gives a
// default may be left out); a pointer the buffer, nullptr when absent (a writable
// one starts as the input given and is written back as an output); a struct's
// members by their names (a nested struct's as "<member>_<field>", an array as
// a buffer); a template instance is named by its types ("strided_copy_float").
// A kernel's return value is the output "ret"; a `void*` parameter's buffer is
// named "<param>:<element type>" ("w:uint16_t").  Every tensor travels as floats
// (integer ones too).  Outputs are written as "<case>/<name>".  Exit status 0
// unless a file or a case is bad.
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

bool arg_has(Args& a, const char* name) { return a.c.has(name); }

bool pock_call(const char* kernel, Args& a);  // generated

namespace {

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
    for (size_t start = 0, end; start <= family.size(); start = end + 1) {  // "k1+k2": each call's outputs are
      end = std::min(family.find('+', start), family.size());                // the next one's buffers
      Args a{c, {}, {}};
      if (!pock_call(family.substr(start, end - start).c_str(), a)) die("unknown kernel family in case " + c.name);
      for (auto& put : a.back) put();
      for (auto& [oname, t] : c.out) c.in[oname] = t;
    }
    for (auto& [oname, t] : c.out) write_tensor(f, c.name + "/" + oname, t);
  }
  if (std::fclose(f) != 0) die(std::string("cannot write ") + argv[2]);
  std::printf("kernel_check: %zu cases\n", cases.size());
  return 0;
}
