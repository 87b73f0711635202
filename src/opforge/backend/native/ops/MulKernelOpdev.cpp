#include "ops/OpApi.h"
#include "ops/OutputSize.h"

#include "PrivateUse1NativeFunctions.h"

namespace opdev {

at::Tensor OpdevNativeFunctions::mul(const at::Tensor& self, const at::Tensor& other) {
  at::Tensor out = op_api::empty(
      output_size::broadcast({self, other}), op_api::result_type({self, other}), self);
  EXEC_OPDEV_CMD(vkMul, self, other, out);
  return out;
}

} // namespace opdev
