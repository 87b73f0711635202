// Output sizes of opdev's operators, computed before the vendor kernel is called (the vendor
// writes into tensors it is given and never allocates).
#pragma once

#include <ATen/Tensor.h>
#include <c10/util/SmallVector.h>

namespace opdev::output_size {

using Sizes = c10::SmallVector<int64_t, 8>;

// Whether the operands' sizes broadcast together, and to what.
bool broadcastable(at::ArrayRef<at::Tensor> operands);
Sizes broadcast(at::ArrayRef<at::Tensor> operands);

// `self` reduced over `dims` (every dimension when empty), kept as size 1 when `keepdim`.
Sizes reduce(const at::Tensor& self, at::IntArrayRef dims, bool keepdim);

} // namespace opdev::output_size
