"""One torch thread for lib's unit tests: their tensors are small, and on a shared machine
intra-op threads only wait for each other (the suite's CPU time triples with two)."""

import torch

torch.set_num_threads(1)
