"""One torch thread for the unit tests: their tensors are small, and on a shared two-core machine
intra-op threads mostly wait for each other (the optimisers' CPU time grows up to 20x with two)."""

import torch

torch.set_num_threads(1)
