#include "ops/OpApi.h"

#include <ATen/ops/empty.h>

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
