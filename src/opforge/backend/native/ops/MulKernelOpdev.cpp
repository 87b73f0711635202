#include "ops/OpApi.h"
#include "ops/OutputSize.h"

#include <ATen/ops/result_type.h>

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

at::Tensor OpdevNativeFunctions::mul(const at::Tensor& self, const at::Tensor& other) {
  at::Tensor out = op_api::empty(
      output_size::broadcast(self, other), at::result_type(self, other), self);
  EXEC_OPDEV_CMD(vkMul, self, other, out);
  return out;
}

} // namespace opdev
