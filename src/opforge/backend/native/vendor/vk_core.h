// Inside the vendor library: descriptors as CPU tensors over the same memory, and the error
// discipline every kernel follows (never throw across the C interface).
#pragma once

#include "vendor/vk.h"

#include <ATen/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/string_view.h>

#include <functional>
#include <initializer_list>
#include <optional>

namespace vk {

at::ScalarType to_scalar_type(int32_t dtype);
at::Tensor host(const vkTensor* t);
std::optional<at::Tensor> host_opt(const vkTensor* t);
at::Scalar scalar(vkScalar s);
std::optional<at::Scalar> scalar_opt(const vkScalar* s);
at::IntArrayRef ints(vkIntArray a);
std::optional<at::IntArrayRef> ints_opt(const vkIntArray* a);
std::optional<at::ScalarType> dtype_opt(const int32_t* dtype);
std::optional<c10::string_view> str_opt(const char* s);

template <typename T>
std::optional<T> opt(const T* p) {
  return p == nullptr ? std::nullopt : std::optional<T>(*p);
}

// Fails with VK_ERROR_UNSUPPORTED_DTYPE unless every given tensor has one of `dtypes`.
vkStatus check_dtypes(
    const char* kernel, std::initializer_list<const vkTensor*> tensors,
    std::initializer_list<int32_t> dtypes);

// Runs `body`, turning any exception into VK_ERROR_INNER and the thread's last error message.
vkStatus guarded(const char* kernel, const std::function<void()>& body);

} // namespace vk
