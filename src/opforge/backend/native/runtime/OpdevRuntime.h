// The opdev runtime: devices whose memory is host memory, so that an out-of-tree backend
// can be built, run and tested on a machine without an accelerator.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace opdev {

constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;

c10::DeviceIndex device_count();
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);

c10::Allocator* allocator();

struct MemoryStats {
  int64_t allocated = 0;      // bytes held by live allocations
  int64_t peak_allocated = 0; // high-water mark since the last reset
  int64_t allocations = 0;    // number of live allocations
};
MemoryStats memory_stats(c10::DeviceIndex index);
void reset_peak_memory(c10::DeviceIndex index);

// A CPU tensor over the same bytes as `t` (same sizes, strides and offset), so that host code
// can read and write device memory. `t` may already be a CPU tensor; it is then returned as is.
at::Tensor host_alias(const at::Tensor& t);

} // namespace opdev
