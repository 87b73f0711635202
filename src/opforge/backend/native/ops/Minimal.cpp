// The kernels every backend needs before any operator: allocation, views, resizing and copies.
// They manage opdev memory themselves and do not go through the vendor kernel library.
#include "runtime/OpdevRuntime.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/equal_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>

#include "PrivateUse1NativeFunctions.h"

namespace opdev {
namespace {

const c10::DispatchKeySet kKeys{c10::DispatchKey::PrivateUse1};

c10::DeviceGuard guard_for(std::optional<at::Device> device) {
  return c10::DeviceGuard(device.value_or(at::Device(kDeviceType, current_device())));
}

} // namespace

at::Tensor OpdevNativeFunctions::empty(
    at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
    std::optional<at::Device> device, std::optional<bool> pin_memory,
    std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.value_or(false), "opdev: pinned memory is a host concept, not opdev's");
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "opdev: only strided tensors are supported");
  auto guard = guard_for(device);
  return at::detail::empty_generic(
      size, allocator(), kKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor OpdevNativeFunctions::empty_strided(
    at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout, std::optional<at::Device> device,
    std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "opdev: pinned memory is a host concept, not opdev's");
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "opdev: only strided tensors are supported");
  auto guard = guard_for(device);
  return at::detail::empty_strided_generic(
      size, stride, allocator(), kKeys, c10::dtype_or_default(dtype));
}

at::Tensor OpdevNativeFunctions::as_strided(
    const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride,
    std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor OpdevNativeFunctions::view(const at::Tensor& self, at::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor OpdevNativeFunctions::_reshape_alias(
    const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& OpdevNativeFunctions::resize_(
    const at::Tensor& self, at::IntArrayRef size, std::optional<at::MemoryFormat> memory_format) {
  // The CPU resize reallocates through the storage's own allocator, which is opdev's.
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& OpdevNativeFunctions::set_(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocator(), /*resizable=*/true);
  return set_(self, storage, 0, {0}, {});
}

at::Tensor& OpdevNativeFunctions::set_(at::Tensor& self, at::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_(self, source, 0, {numel}, {});
}

at::Tensor& OpdevNativeFunctions::set_(
    at::Tensor& self, at::Storage source, int64_t storage_offset, at::IntArrayRef size,
    at::IntArrayRef stride) {
  TORCH_CHECK(
      source.device().type() == kDeviceType,
      "opdev: set_ expected a storage on opdev, got one on ", source.device());
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& OpdevNativeFunctions::set_(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor OpdevNativeFunctions::_copy_from(
    const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  // Both sides are host memory: copy through CPU aliases, which also converts dtypes and
  // handles any strides. Copies are synchronous, so non_blocking changes nothing.
  TORCH_CHECK(self.defined() && dst.defined(), "opdev: _copy_from needs defined tensors");
  host_alias(dst).copy_(host_alias(self));
  return dst;
}

at::Tensor OpdevNativeFunctions::_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return _copy_from(self, dst, false);
}

at::Scalar OpdevNativeFunctions::_local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(host_alias(self));
}

at::Tensor& OpdevNativeFunctions::fill_(at::Tensor& self, const at::Scalar& value) {
  host_alias(self).fill_(value);
  return self;
}

at::Tensor& OpdevNativeFunctions::zero_(at::Tensor& self) {
  host_alias(self).zero_();
  return self;
}

at::Tensor OpdevNativeFunctions::_efficientzerotensor(
    at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> /*layout*/,
    std::optional<at::Device> device, std::optional<bool> /*pin_memory*/) {
  // Autograd's zero gradients (sgn's, say): a tensor of the ZeroTensor key that holds no memory at all.
  auto guard = guard_for(device);
  at::Device where(kDeviceType, current_device());
  at::native::ZeroTensorAllocator zeros(where);
  const c10::DispatchKeySet keys = kKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &zeros, keys, c10::dtype_or_default(dtype), std::nullopt);
}

bool OpdevNativeFunctions::equal(const at::Tensor& self, const at::Tensor& other) {
  return at::native::cpu_equal(host_alias(self), host_alias(other));
}

} // namespace opdev
