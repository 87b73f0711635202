#include "vendor/vk_core.h"

#include <ATen/ops/from_blob.h>

#include <string>

namespace vk {
namespace {

thread_local std::string last_error;

const at::ScalarType kTypes[] = {
    at::kFloat, at::kHalf,  at::kBFloat16, at::kDouble, at::kChar,          at::kByte,
    at::kShort, at::kInt,   at::kLong,     at::kBool,   at::kComplexFloat, at::kComplexDouble,
};

const char* dtype_name(int32_t dtype) {
  return dtype >= 0 && dtype < 12 ? c10::toString(kTypes[dtype]) : "unknown";
}

} // namespace

at::ScalarType to_scalar_type(int32_t dtype) {
  if (dtype < 0 || dtype >= 12) {
    throw std::invalid_argument("unknown vkDataType " + std::to_string(dtype));
  }
  return kTypes[dtype];
}

at::Tensor host(const vkTensor* t) {
  if (t == nullptr) {
    throw std::invalid_argument("a required tensor is null");
  }
  at::IntArrayRef sizes(t->sizes, t->ndim);
  at::IntArrayRef strides(t->strides, t->ndim);
  return at::from_blob(
      t->data, sizes, strides, [](void*) {}, at::TensorOptions().dtype(to_scalar_type(t->dtype)));
}

std::optional<at::Tensor> host_opt(const vkTensor* t) {
  return t == nullptr ? std::nullopt : std::optional<at::Tensor>(host(t));
}

at::Scalar scalar(vkScalar s) {
  switch (s.kind) {
    case VK_SCALAR_INT:
      return at::Scalar(s.i);
    case VK_SCALAR_BOOL:
      return at::Scalar(s.i != 0);
    default:
      return at::Scalar(s.f);
  }
}

std::optional<at::Scalar> scalar_opt(const vkScalar* s) {
  return s == nullptr ? std::nullopt : std::optional<at::Scalar>(scalar(*s));
}

at::IntArrayRef ints(vkIntArray a) {
  return at::IntArrayRef(a.data, a.len);
}

std::optional<at::IntArrayRef> ints_opt(const vkIntArray* a) {
  return a == nullptr ? std::nullopt : std::optional<at::IntArrayRef>(ints(*a));
}

std::optional<at::ScalarType> dtype_opt(const int32_t* dtype) {
  return dtype == nullptr ? std::nullopt : std::optional<at::ScalarType>(to_scalar_type(*dtype));
}

std::optional<c10::string_view> str_opt(const char* s) {
  return s == nullptr ? std::nullopt : std::optional<c10::string_view>(s);
}

vkStatus check_dtypes(
    const char* kernel, std::initializer_list<const vkTensor*> tensors,
    std::initializer_list<int32_t> dtypes) {
  for (const vkTensor* t : tensors) {
    if (t == nullptr) {
      continue;
    }
    bool ok = false;
    for (int32_t d : dtypes) {
      ok = ok || d == t->dtype;
    }
    if (!ok) {
      last_error = std::string(kernel) + ": dtype " + dtype_name(t->dtype) + " is not supported";
      return VK_ERROR_UNSUPPORTED_DTYPE;
    }
  }
  return VK_SUCCESS;
}

vkStatus guarded(const char* kernel, const std::function<void()>& body) {
  try {
    body();
    last_error.clear();
    return VK_SUCCESS;
  } catch (const std::invalid_argument& e) {
    last_error = std::string(kernel) + ": " + e.what();
    return VK_ERROR_INVALID_PARAM;
  } catch (const std::exception& e) {
    // c10::Error's what() carries a C++ backtrace; its message alone is what a caller needs.
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    last_error = std::string(kernel) + ": " + (c10_error ? c10_error->msg() : e.what());
    return VK_ERROR_INNER;
  }
}

} // namespace vk

extern "C" const char* vkGetLastErrorMessage(void) {
  return vk::last_error.c_str();
}
