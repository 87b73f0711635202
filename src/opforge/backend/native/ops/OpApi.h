// What a backend kernel needs to call the vendor library: EXEC_OPDEV_CMD converts each ATen
// argument to its vk descriptor, calls the kernel and turns a failed status into a PyTorch error
// that carries the vendor's message (the analogue of torch_npu's EXEC_NPU_CMD).
#pragma once

#include "runtime/OpdevRuntime.h"
#include "vendor/vk.h"
#include "vk_kernels.h"

#include <ATen/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/string_view.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace opdev::op_api {

int32_t to_vk_dtype(at::ScalarType type);

// A new opdev tensor on `like`'s device.
at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like);

// A tensor on the meta device with `t`'s sizes, strides and dtype: ATen's Meta kernels then give an
// operator's output size and dtype without touching memory.
at::Tensor meta(const at::Tensor& t);
std::optional<at::Tensor> meta(const std::optional<at::Tensor>& t);

// Whether `t` has one of `dtypes` (an operator's CHECKLIST dtypes).
bool dtype_in(const at::Tensor& t, std::initializer_list<at::ScalarType> dtypes);

// Output dtypes: the operands' promoted type, and the same with integers promoted to the default float.
at::ScalarType result_type(at::ArrayRef<at::Tensor> operands);
at::ScalarType int_to_float(at::ScalarType type);

class TensorArg {
 public:
  explicit TensorArg(const at::Tensor& t);
  const vkTensor* get() const;

 private:
  bool defined_ = false;
  std::vector<int64_t> sizes_, strides_;
  mutable vkTensor desc_{};
};

template <typename T>
class OptionalArg {
 public:
  explicit OptionalArg(std::optional<T> v) : value_(std::move(v)) {}
  const T* get() const {
    return value_ ? &*value_ : nullptr;
  }

 private:
  std::optional<T> value_;
};

class IntArrayArg {
 public:
  explicit IntArrayArg(at::IntArrayRef v) : values_(v.vec()) {}
  vkIntArray get() const {
    return {values_.data(), static_cast<int64_t>(values_.size())};
  }

 private:
  std::vector<int64_t> values_;
};

class OptionalIntArrayArg {
 public:
  explicit OptionalIntArrayArg(at::OptionalIntArrayRef v)
      : present_(v.has_value()), values_(v ? v->vec() : std::vector<int64_t>()) {}
  const vkIntArray* get() const {
    array_ = {values_.data(), static_cast<int64_t>(values_.size())};
    return present_ ? &array_ : nullptr;
  }

 private:
  bool present_;
  std::vector<int64_t> values_;
  mutable vkIntArray array_{};
};

class StringArg {
 public:
  explicit StringArg(std::optional<c10::string_view> v)
      : present_(v.has_value()), value_(v ? std::string(*v) : std::string()) {}
  const char* get() const {
    return present_ ? value_.c_str() : nullptr;
  }

 private:
  bool present_;
  std::string value_;
};

vkScalar to_vk_scalar(const at::Scalar& s);

inline TensorArg convert(const at::Tensor& t) { return TensorArg(t); }
inline TensorArg convert(const std::optional<at::Tensor>& t) { return TensorArg(t.value_or(at::Tensor())); }
inline vkScalar convert(const at::Scalar& s) { return to_vk_scalar(s); }
inline OptionalArg<vkScalar> convert(const std::optional<at::Scalar>& s) {
  return OptionalArg<vkScalar>(s ? std::optional<vkScalar>(to_vk_scalar(*s)) : std::nullopt);
}
inline IntArrayArg convert(at::IntArrayRef v) { return IntArrayArg(v); }
inline OptionalIntArrayArg convert(at::OptionalIntArrayRef v) { return OptionalIntArrayArg(v); }
inline int64_t convert(int64_t v) { return v; }
inline double convert(double v) { return v; }
inline bool convert(bool v) { return v; }
inline OptionalArg<int64_t> convert(std::optional<int64_t> v) { return OptionalArg<int64_t>(v); }
inline OptionalArg<double> convert(std::optional<double> v) { return OptionalArg<double>(v); }
inline OptionalArg<bool> convert(std::optional<bool> v) { return OptionalArg<bool>(v); }
inline int32_t convert(at::ScalarType t) { return to_vk_dtype(t); }
inline OptionalArg<int32_t> convert(std::optional<at::ScalarType> t) {
  return OptionalArg<int32_t>(t ? std::optional<int32_t>(to_vk_dtype(*t)) : std::nullopt);
}
inline StringArg convert(c10::string_view s) { return StringArg(s); }
inline StringArg convert(std::optional<c10::string_view> s) { return StringArg(s); }

template <typename T>
decltype(auto) pass(const T& held) {
  if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, vkScalar>) {
    return held;
  } else {
    return held.get();
  }
}

template <typename Kernel, typename... Args>
void exec(const char* name, Kernel kernel, const Args&... args) {
  auto held = std::make_tuple(convert(args)...);
  vkStatus status = std::apply([&](const auto&... h) { return kernel(pass(h)...); }, held);
  TORCH_CHECK(
      status == VK_SUCCESS, name, " failed with vendor status ", status, ": ",
      vkGetLastErrorMessage());
}

} // namespace opdev::op_api

#define EXEC_OPDEV_CMD(kernel, ...) ::opdev::op_api::exec(#kernel, kernel, __VA_ARGS__)
