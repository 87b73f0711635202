#include "ops/OutputSize.h"

#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtilsMulti.h>

namespace opdev::output_size {

Sizes broadcast(at::ArrayRef<at::Tensor> operands) {
  at::DimVector sizes;
  for (const at::Tensor& t : operands) {
    sizes = at::infer_size_dimvector(sizes, t.sizes());
  }
  return Sizes(sizes.begin(), sizes.end());
}

bool broadcastable(at::ArrayRef<at::Tensor> operands) {
  try {
    broadcast(operands);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

Sizes reduce(const at::Tensor& self, at::IntArrayRef dims, bool keepdim) {
  const auto reduced = at::dim_list_to_bitset(dims, self.dim());
  Sizes sizes;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (dims.empty() || reduced[d]) {
      if (keepdim) {
        sizes.push_back(1);
      }
    } else {
      sizes.push_back(self.size(d));
    }
  }
  return sizes;
}

} // namespace opdev::output_size
