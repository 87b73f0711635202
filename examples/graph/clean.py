"""A script that compiles and runs clean."""

import torch

print(torch.compile(lambda x: x + 1, backend="eager")(torch.ones(3)))
