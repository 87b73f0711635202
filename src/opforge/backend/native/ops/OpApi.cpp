#include "ops/OpApi.h"

#include <ATen/native/TypeProperties.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <algorithm>

namespace opdev::op_api {

int32_t to_vk_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return VK_DT_FLOAT;
    case at::kHalf: return VK_DT_FLOAT16;
    case at::kBFloat16: return VK_DT_BFLOAT16;
    case at::kDouble: return VK_DT_DOUBLE;
    case at::kChar: return VK_DT_INT8;
    case at::kByte: return VK_DT_UINT8;
    case at::kShort: return VK_DT_INT16;
    case at::kInt: return VK_DT_INT32;
    case at::kLong: return VK_DT_INT64;
    case at::kBool: return VK_DT_BOOL;
    case at::kComplexFloat: return VK_DT_COMPLEX64;
    case at::kComplexDouble: return VK_DT_COMPLEX128;
    default: TORCH_CHECK(false, "opdev: the vendor library has no data type for ", type);
  }
}

at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
  at::Device device = like.device().type() == kDeviceType ? like.device()
                                                           : at::Device(kDeviceType, current_device());
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(device));
}

bool dtype_in(const at::Tensor& t, std::initializer_list<at::ScalarType> dtypes) {
  return std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) != dtypes.end();
}

at::Tensor meta(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

std::optional<at::Tensor> meta(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? std::optional<at::Tensor>(meta(*t)) : t;
}

at::ScalarType result_type(at::ArrayRef<at::Tensor> operands) {
  at::native::ResultTypeState state;
  for (const at::Tensor& t : operands) {
    state = at::native::update_result_type_state(t, state);
  }
  return at::native::result_type(state);
}

at::ScalarType int_to_float(at::ScalarType type) {
  return at::isIntegralType(type, /*includeBool=*/true) ? c10::typeMetaToScalarType(at::get_default_dtype())
                                                         : type;
}

TensorArg::TensorArg(const at::Tensor& t) : defined_(t.defined()) {
  if (!defined_) {
    return;
  }
  sizes_ = t.sizes().vec();
  strides_ = t.strides().vec();
  desc_.data = t.data_ptr();
  desc_.dtype = to_vk_dtype(t.scalar_type());
  desc_.ndim = static_cast<int32_t>(t.dim());
}

const vkTensor* TensorArg::get() const {
  if (!defined_) {
    return nullptr;
  }
  // Point at this holder's own vectors: the holder may have been moved since it was built.
  desc_.sizes = sizes_.data();
  desc_.strides = strides_.data();
  return &desc_;
}

vkScalar to_vk_scalar(const at::Scalar& s) {
  if (s.isBoolean()) {
    return {VK_SCALAR_BOOL, 0.0, s.toBool() ? 1 : 0};
  }
  if (s.isIntegral(false)) {
    return {VK_SCALAR_INT, 0.0, s.toLong()};
  }
  TORCH_CHECK(!s.isComplex(), "opdev: complex scalars are not supported by the vendor library");
  return {VK_SCALAR_DOUBLE, s.toDouble(), 0};
}

} // namespace opdev::op_api
