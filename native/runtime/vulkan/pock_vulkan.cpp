// pock_vulkan.cpp — see pock_vulkan.h.  Plain Vulkan 1.0 compute, no extensions.
#include "pock_vulkan.h"

#include <vulkan/vulkan.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace pvk {

struct Device {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice gpu = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint8_t* mapped = nullptr;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorPool pool = VK_NULL_HANDLE;
  VkDescriptorSet set = VK_NULL_HANDLE;
  std::vector<VkShaderModule> modules;
  std::vector<VkPipeline> pipelines;
  VkCommandPool cmd_pool = VK_NULL_HANDLE;
  std::vector<VkCommandBuffer> cmds;
  VkFence fence = VK_NULL_HANDLE;
  std::mutex lock;
  std::string name;
};

namespace {

std::string g_error;

const char* vk_name(VkResult r) {
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    default: return "VkResult error";
  }
}

struct Failed {
  std::string what;
};

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw Failed{std::string(what) + " failed (" + vk_name(r) + ")"};
}

void create(Device& d, const Program& p) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "pockengine";
  app.apiVersion = VK_API_VERSION_1_0;
  VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  VkResult r = vkCreateInstance(&ici, nullptr, &d.instance);
  if (r != VK_SUCCESS)
    throw Failed{std::string("no Vulkan driver: vkCreateInstance failed (") + vk_name(r) +
                 "); install one (e.g. Debian's mesa-vulkan-drivers) or build with backends=['cpu']"};
  uint32_t n = 0;
  vkEnumeratePhysicalDevices(d.instance, &n, nullptr);
  std::vector<VkPhysicalDevice> gpus(n);
  if (n) vkEnumeratePhysicalDevices(d.instance, &n, gpus.data());
  uint32_t family = 0;
  for (VkPhysicalDevice g : gpus) {
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(g, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qs(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(g, &nq, qs.data());
    for (uint32_t i = 0; i < nq && !d.gpu; ++i)
      if (qs[i].queueFlags & VK_QUEUE_COMPUTE_BIT) d.gpu = g, family = i;
    if (d.gpu) break;
  }
  if (!d.gpu)
    throw Failed{"no Vulkan device with a compute queue found (" + std::to_string(n) +
                 " physical devices); install a Vulkan driver (e.g. mesa-vulkan-drivers) or build with "
                 "backends=['cpu']"};
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(d.gpu, &props);
  d.name = props.deviceName;
  const VkPhysicalDeviceLimits& lim = props.limits;
  if (static_cast<uint32_t>(p.n_windows) > lim.maxPerStageDescriptorStorageBuffers)
    throw Failed{"the step's shaders bind " + std::to_string(p.n_windows) + " storage buffers; " + d.name +
                 " allows " + std::to_string(lim.maxPerStageDescriptorStorageBuffers) +
                 " (rebuild with a larger POCK_VK_MAX_BUFFER_BYTES if it binds more bytes per buffer)"};
  for (int32_t k = 0; k < p.n_windows; ++k) {
    const Window& w = p.windows[k];
    if (static_cast<uint64_t>(w.size) > lim.maxStorageBufferRange)
      throw Failed{"the step needs " + std::to_string(w.size) + " bytes of Vulkan memory in one buffer binding; " +
                   d.name + " binds at most " + std::to_string(lim.maxStorageBufferRange) +
                   " (rebuild with POCK_VK_MAX_BUFFER_BYTES=" + std::to_string(lim.maxStorageBufferRange) + ")"};
    if (w.offset % static_cast<int64_t>(lim.minStorageBufferOffsetAlignment ? lim.minStorageBufferOffsetAlignment : 1))
      throw Failed{"a Vulkan buffer binding starts at byte " + std::to_string(w.offset) + ", not a multiple of " +
                   d.name + "'s minStorageBufferOffsetAlignment " + std::to_string(lim.minStorageBufferOffsetAlignment)};
  }

  float prio = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &prio;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  check(vkCreateDevice(d.gpu, &dci, nullptr, &d.device), "vkCreateDevice");
  vkGetDeviceQueue(d.device, family, 0, &d.queue);

  // The one buffer, in host-visible coherent memory (on UMA phones and lavapipe
  // that is the device's own memory).
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = static_cast<VkDeviceSize>(p.memory_bytes > 0 ? p.memory_bytes : 64);
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  check(vkCreateBuffer(d.device, &bci, nullptr, &d.buffer), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(d.device, d.buffer, &req);
  VkPhysicalDeviceMemoryProperties mp;
  vkGetPhysicalDeviceMemoryProperties(d.gpu, &mp);
  const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  uint32_t type = UINT32_MAX;
  for (uint32_t i = 0; i < mp.memoryTypeCount && type == UINT32_MAX; ++i)
    if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) type = i;
  if (type == UINT32_MAX) throw Failed{d.name + " has no host-visible coherent memory for storage buffers"};
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = type;
  check(vkAllocateMemory(d.device, &mai, nullptr, &d.memory), "vkAllocateMemory");
  check(vkBindBufferMemory(d.device, d.buffer, d.memory, 0), "vkBindBufferMemory");
  void* mapped = nullptr;
  check(vkMapMemory(d.device, d.memory, 0, VK_WHOLE_SIZE, 0, &mapped), "vkMapMemory");
  d.mapped = static_cast<uint8_t*>(mapped);
  std::memset(d.mapped, 0, static_cast<size_t>(bci.size));

  // One descriptor set (a binding per window of the buffer) and one pipeline layout
  // (128 bytes of push constants) for every shader.
  const uint32_t nw = static_cast<uint32_t>(p.n_windows > 0 ? p.n_windows : 1);
  std::vector<VkDescriptorSetLayoutBinding> binds(nw);
  for (uint32_t k = 0; k < nw; ++k)
    binds[k] = {k, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo sli{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  sli.bindingCount = nw;
  sli.pBindings = binds.data();
  check(vkCreateDescriptorSetLayout(d.device, &sli, nullptr, &d.set_layout), "vkCreateDescriptorSetLayout");
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
  VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pli.setLayoutCount = 1;
  pli.pSetLayouts = &d.set_layout;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &range;
  check(vkCreatePipelineLayout(d.device, &pli, nullptr, &d.layout), "vkCreatePipelineLayout");
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, nw};
  VkDescriptorPoolCreateInfo dpi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  dpi.maxSets = 1;
  dpi.poolSizeCount = 1;
  dpi.pPoolSizes = &ps;
  check(vkCreateDescriptorPool(d.device, &dpi, nullptr, &d.pool), "vkCreateDescriptorPool");
  VkDescriptorSetAllocateInfo dai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  dai.descriptorPool = d.pool;
  dai.descriptorSetCount = 1;
  dai.pSetLayouts = &d.set_layout;
  check(vkAllocateDescriptorSets(d.device, &dai, &d.set), "vkAllocateDescriptorSets");
  std::vector<VkDescriptorBufferInfo> dbi(nw, VkDescriptorBufferInfo{d.buffer, 0, VK_WHOLE_SIZE});
  for (int32_t k = 0; k < p.n_windows; ++k)
    dbi[static_cast<size_t>(k)] = {d.buffer, static_cast<VkDeviceSize>(p.windows[k].offset),
                                   static_cast<VkDeviceSize>(p.windows[k].size)};
  VkWriteDescriptorSet w{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
  w.dstSet = d.set;
  w.dstBinding = 0;
  w.descriptorCount = nw;  // consecutive bindings 0..nw-1, one descriptor each
  w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
  w.pBufferInfo = dbi.data();
  vkUpdateDescriptorSets(d.device, 1, &w, 0, nullptr);

  for (int32_t i = 0; i < p.n_shaders; ++i) {
    VkShaderModuleCreateInfo smi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    smi.codeSize = p.shaders[i].words * 4u;
    smi.pCode = p.shaders[i].code;
    VkShaderModule m;
    check(vkCreateShaderModule(d.device, &smi, nullptr, &m), "vkCreateShaderModule");
    d.modules.push_back(m);
    VkComputePipelineCreateInfo cpi{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    cpi.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, nullptr, 0, VK_SHADER_STAGE_COMPUTE_BIT, m,
                 "main", nullptr};
    cpi.layout = d.layout;
    VkPipeline pipe;
    check(vkCreateComputePipelines(d.device, VK_NULL_HANDLE, 1, &cpi, nullptr, &pipe),
          (std::string("vkCreateComputePipelines(") + p.shaders[i].name + ")").c_str());
    d.pipelines.push_back(pipe);
  }

  // One command buffer per segment, recorded once: each dispatch, then a barrier
  // so the next one sees its writes; at the end the host may read everything.
  VkCommandPoolCreateInfo cpci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cpci.queueFamilyIndex = family;
  check(vkCreateCommandPool(d.device, &cpci, nullptr, &d.cmd_pool), "vkCreateCommandPool");
  d.cmds.resize(static_cast<size_t>(p.n_segments));
  if (p.n_segments > 0) {
    VkCommandBufferAllocateInfo cbi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cbi.commandPool = d.cmd_pool;
    cbi.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cbi.commandBufferCount = static_cast<uint32_t>(p.n_segments);
    check(vkAllocateCommandBuffers(d.device, &cbi, d.cmds.data()), "vkAllocateCommandBuffers");
  }
  VkMemoryBarrier between{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_SHADER_WRITE_BIT,
                          VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
  VkMemoryBarrier to_host{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, VK_ACCESS_SHADER_WRITE_BIT,
                          VK_ACCESS_HOST_READ_BIT};
  for (int32_t s = 0; s < p.n_segments; ++s) {
    VkCommandBuffer cb = d.cmds[static_cast<size_t>(s)];
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    check(vkBeginCommandBuffer(cb, &begin), "vkBeginCommandBuffer");
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, d.layout, 0, 1, &d.set, 0, nullptr);
    int32_t bound = -1;
    for (int32_t k = p.segments[s].first; k < p.segments[s].first + p.segments[s].count; ++k) {
      const Dispatch& dp = p.dispatches[k];
      if (dp.shader != bound) {
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipelines[static_cast<size_t>(dp.shader)]);
        bound = dp.shader;
      }
      vkCmdPushConstants(cb, d.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, 128, dp.push);
      vkCmdDispatch(cb, dp.groups[0], dp.groups[1], dp.groups[2]);
      vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                           &between, 0, nullptr, 0, nullptr);
    }
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &to_host, 0,
                         nullptr, 0, nullptr);
    check(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
  }
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(d.device, &fci, nullptr, &d.fence), "vkCreateFence");
}

}  // namespace

Device* open(const Program* prog, const char** error) {
  // Created once per model library and kept for the life of the process: the
  // buffer is scratch for one step (state is copied in and out by the step's
  // transfer nodes), so every trainer of this model can share it under step_lock.
  static Device* device = [&]() -> Device* {
    Device* d = new Device();
    try {
      create(*d, *prog);
      return d;
    } catch (const Failed& f) {
      g_error = f.what;
    } catch (const std::exception& e) {
      g_error = std::string("Vulkan initialisation failed: ") + e.what();
    }
    return nullptr;  // the half-made device is leaked: the process has no Vulkan to give it back to
  }();
  if (!device && error) *error = g_error.c_str();
  return device;
}

uint8_t* memory(Device* d) { return d->mapped; }

std::mutex& step_lock(Device* d) { return d->lock; }

bool run(Device* d, int32_t segment) {
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &d->cmds[static_cast<size_t>(segment)];
  if (vkQueueSubmit(d->queue, 1, &si, d->fence) != VK_SUCCESS) return false;
  const bool ok = vkWaitForFences(d->device, 1, &d->fence, VK_TRUE, UINT64_MAX) == VK_SUCCESS;
  vkResetFences(d->device, 1, &d->fence);
  return ok;
}

namespace {
// As kernels/optimizer.cpp: the double a short decimal literal for f gives.
double as_decimal(float f) {
  if (!(f > 0.f) || !std::isfinite(f)) return f;
  const int e10 = static_cast<int>(std::floor(std::log10(static_cast<double>(f))));
  for (int digits = 1; digits <= 9; ++digits) {
    const int k = digits - 1 - e10;
    if (k > 22 || k < -22) break;
    const double p10 = std::pow(10.0, k < 0 ? -k : k);
    const double n = std::nearbyint(k >= 0 ? f * p10 : f / p10);
    const double v = k >= 0 ? n / p10 : n * p10;
    if (static_cast<float>(v) == f) return v;
  }
  return f;
}
}  // namespace

void adamw_scalars(float* out, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  const double lr_d = lr, b1 = as_decimal(beta1), b2 = as_decimal(beta2);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const float w = static_cast<float>(1.0 - b1);
  out[0] = static_cast<float>(-(lr_d / bc1));
  out[1] = static_cast<float>(std::sqrt(bc2));
  out[2] = static_cast<float>(1.0 - lr_d * weight_decay);
  out[3] = w;
  out[4] = 1.f - w;
  out[5] = static_cast<float>(1.0 - b2);
  out[6] = beta2;
  out[7] = eps;
}

}  // namespace pvk
