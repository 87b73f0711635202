// Allocator, device guard, generator and hooks of the opdev device.
#include "runtime/OpdevRuntime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace opdev {
namespace {

constexpr c10::DeviceIndex kMaxDevices = 16;

c10::DeviceIndex read_device_count() {
  // OPDEV_DEVICE_COUNT lets tests exercise the device guard across devices.
  const char* env = std::getenv("OPDEV_DEVICE_COUNT");
  int n = env ? std::atoi(env) : 2;
  return static_cast<c10::DeviceIndex>(std::max(1, std::min<int>(n, kMaxDevices)));
}

thread_local c10::DeviceIndex tls_device = 0;

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < device_count(),
      "opdev: invalid device index ", static_cast<int>(index), " (the machine has ",
      static_cast<int>(device_count()), " opdev devices)");
}

// Every live allocation, so that frees are counted against the device that made them and a
// pointer can be traced back to its device (getDeviceFromPtr).
struct Registry {
  struct Block {
    size_t bytes;
    c10::DeviceIndex device;
  };
  std::mutex mutex;
  std::unordered_map<void*, Block> blocks;
  MemoryStats stats[kMaxDevices];
};

Registry& registry() {
  static Registry* r = new Registry(); // never destroyed: frees may run at process exit
  return *r;
}

void free_block(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.blocks.find(ptr);
    if (it != r.blocks.end()) {
      MemoryStats& s = r.stats[it->second.device];
      s.allocated -= static_cast<int64_t>(it->second.bytes);
      s.allocations -= 1;
      r.blocks.erase(it);
    }
  }
  c10::free_cpu(ptr);
}

struct OpdevAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    void* ptr = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (ptr != nullptr) {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      r.blocks[ptr] = {nbytes, device};
      MemoryStats& s = r.stats[device];
      s.allocated += static_cast<int64_t>(nbytes);
      s.allocations += 1;
      s.peak_allocated = std::max(s.peak_allocated, s.allocated);
    }
    return {ptr, ptr, &free_block, c10::Device(kDeviceType, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_block;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

OpdevAllocator g_allocator;

// Execution is synchronous, so streams are the default stream and events are always complete.
struct OpdevGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kDeviceType;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return {kDeviceType, current_device()};
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDeviceType, "opdev: expected an opdev device, got ", d);
    set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    tls_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;
  }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, OpdevGuardImpl);

// The device's random state is the CPU generator's engine (mt19937), tagged with the device: the
// kernels run on the host.
struct OpdevGenerator final : at::CPUGeneratorImpl {
  explicit OpdevGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(kDeviceType, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::once_flag once;
  static std::vector<at::Generator> generators;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      generators.push_back(at::make_generator<OpdevGenerator>(i));
      generators.back().set_current_seed(c10::detail::getNonDeterministicRandom());
    }
  });
  c10::DeviceIndex i = index == -1 ? current_device() : index;
  check_index(i);
  return generators[i];
}

struct OpdevHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<OpdevGenerator>(index == -1 ? current_device() : index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.blocks.find(data);
    TORCH_CHECK(it != r.blocks.end(), "opdev: the pointer was not allocated by opdev");
    return {kDeviceType, it->second.device};
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    set_device(index);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    c10::DeviceIndex old = current_device();
    set_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return c10::GetCPUAllocator();
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "opdev: trying to resize storage that is not resizable");
    c10::DataPtr fresh = g_allocator.allocate(newsize);
    size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) {
      std::memcpy(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new OpdevHooks());
  return true;
}();

} // namespace

c10::DeviceIndex device_count() {
  static c10::DeviceIndex n = read_device_count();
  return n;
}

c10::DeviceIndex current_device() {
  return tls_device;
}

void set_device(c10::DeviceIndex index) {
  check_index(index);
  tls_device = index;
}

c10::Allocator* allocator() {
  return &g_allocator;
}

MemoryStats memory_stats(c10::DeviceIndex index) {
  check_index(index);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.stats[index];
}

void reset_peak_memory(c10::DeviceIndex index) {
  check_index(index);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.stats[index].peak_allocated = r.stats[index].allocated;
}

at::Tensor host_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) {
    return t;
  }
  TORCH_CHECK(t.device().type() == kDeviceType, "opdev: cannot alias a tensor on ", t.device());
  return at::from_blob(
      t.data_ptr(), t.sizes(), t.strides(), [](void*) {},
      t.options().device(c10::kCPU));
}

} // namespace opdev

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &opdev::g_allocator);
