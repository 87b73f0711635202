// aten::ne on opdev: each overload's kernel follows its CHECKLIST (adaptations/).
#include "ops/OpApi.h"
#include "ops/OutputSize.h"

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

// aten::ne.Tensor: from adaptations/ne.Tensor/CHECKLIST.md (dtypes, checks, output, vendor kernel)
at::Tensor OpdevNativeFunctions::ne(const at::Tensor & self, const at::Tensor & other) {
  TORCH_CHECK(op_api::dtype_in(self, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort, at::kInt, at::kLong, at::kBool}), "ne: self must have dtype in [float32 float64 float16 bfloat16 int8 uint8 int16 int32 int64 bool] on opdev");
  TORCH_CHECK(op_api::dtype_in(other, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort, at::kInt, at::kLong, at::kBool}), "ne: other must have dtype in [float32 float64 float16 bfloat16 int8 uint8 int16 int32 int64 bool] on opdev");
  TORCH_CHECK(output_size::broadcastable({self, other}), "ne: the shapes of self, other cannot be broadcast together");
  at::Tensor out = op_api::empty(output_size::broadcast({self, other}), at::kBool, self);
  EXEC_OPDEV_CMD(vkNe, self, other, out);
  return out;
}

// aten::ne.Scalar: from adaptations/ne.Scalar/CHECKLIST.md (dtypes, checks, output, vendor kernel)
at::Tensor OpdevNativeFunctions::ne(const at::Tensor & self, const at::Scalar & other) {
  TORCH_CHECK(op_api::dtype_in(self, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort, at::kInt, at::kLong, at::kBool}), "ne: self must have dtype in [float32 float64 float16 bfloat16 int8 uint8 int16 int32 int64 bool] on opdev");
  at::Tensor out = op_api::empty(self.sizes(), at::kBool, self);
  EXEC_OPDEV_CMD(vkNeScalar, self, other, out);
  return out;
}

} // namespace opdev
