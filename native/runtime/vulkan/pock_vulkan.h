// pock_vulkan.h — the small Vulkan runtime a generated model with a Vulkan
// partition calls (pock_vulkan.cpp, linked only into such models, with -lvulkan).
//
// The whole step's device memory is one host-visible, host-coherent buffer,
// laid out by the compiler as [scalars | device arena | state mirror].  Every
// run of consecutive Vulkan nodes (a segment) is one command buffer, recorded
// once when the device opens and re-submitted every step; a shader finds its
// operands through push constants (word offsets).  The shaders see the buffer
// through one binding per window (a byte range within maxStorageBufferRange;
// several when the step needs more than one binding covers, see common.glsl).  The
// host moves data in and out with memcpy at the step's transfer nodes.
#pragma once
#include <cstdint>
#include <mutex>

namespace pvk {

struct Shader {            // SPIR-V compiled from native/runtime/vulkan/shaders/<name>.comp
  const char* name;
  const uint32_t* code;
  uint32_t words;
};

struct Dispatch {          // one vkCmdDispatch of a segment
  int32_t shader;          // index into Program::shaders
  uint32_t groups[3];
  uint32_t push[32];       // the push constants (128 bytes)
};

struct Segment {           // dispatches [first, first + count) in one command buffer
  int32_t first, count;
};

struct Window {            // one storage-buffer binding: bytes [offset, offset + size) of the buffer
  int64_t offset, size;
};

struct Program {
  const Shader* shaders;
  int32_t n_shaders;
  const Dispatch* dispatches;
  int32_t n_dispatches;
  const Segment* segments;
  int32_t n_segments;
  int64_t memory_bytes;    // the one device buffer
  const Window* windows;   // binding k of every shader is windows[k]
  int32_t n_windows;
};

struct Device;

// The device of this model library, created at the first call: instance,
// device, buffer, pipelines, descriptor set and one command buffer per
// segment.  nullptr when there is no usable Vulkan device; then *error (when
// not null) says why, naming what is missing.
Device* open(const Program* prog, const char** error);
uint8_t* memory(Device* d);          // the mapped buffer
std::mutex& step_lock(Device* d);    // one step at a time on the shared buffer
bool run(Device* d, int32_t segment);  // submit the segment and wait; false on a device error

// AdamW's per-step scalars, in double and rounded once like kernels/optimizer.cpp:
// out = {-lr/bc1, sqrt(bc2), 1-lr*wd, 1-b1, b1, 1-b2, b2, eps}.
void adamw_scalars(float* out, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step);

}  // namespace pvk
