"""An allocation the host refuses, compiled or not: a runtime problem, not a graph-mode one."""

import torch

x = torch.empty(1 << 50)  # a petabyte of floats: the host refuses it, compiled or not
