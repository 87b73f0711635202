// aten::sum on opdev: each overload's kernel follows its CHECKLIST (adaptations/).
#include "ops/OpApi.h"
#include "ops/OutputSize.h"

#include <ATen/ops/sum.h>

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

// aten::sum.dim_IntList: from adaptations/sum.dim_IntList/CHECKLIST.md (dtypes, checks, output, vendor kernel)
at::Tensor OpdevNativeFunctions::sum(const at::Tensor & self, at::OptionalIntArrayRef dim, bool keepdim, ::std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(op_api::dtype_in(self, {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort, at::kInt, at::kLong, at::kBool}), "sum: self must have dtype in [float32 float64 float16 bfloat16 int8 uint8 int16 int32 int64 bool] on opdev");
  // ATen's Meta kernel gives the output's size and dtype for these arguments
  at::Tensor shape = at::sum(op_api::meta(self), dim, keepdim, dtype);
  at::Tensor out = op_api::empty(shape.sizes(), shape.scalar_type(), self);
  EXEC_OPDEV_CMD(vkSum, self, dim, keepdim, dtype, out);
  return out;
}

} // namespace opdev
