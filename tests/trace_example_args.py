"""Arguments of the tracing example of docs/tracing.md:

    python -m stress trace --kernel tests.trace_kernels:gather_groups --grid 3 --args tests/trace_example_args.py

Three groups of different lengths reached through a table of their addresses (as a grouped
block table or a LoRA weight table is); row g of ``out`` receives group g.
"""

import torch

groups = [torch.arange(n, dtype=torch.float32) + 100 * g for g, n in enumerate((5, 3, 8))]
table = torch.tensor([t.data_ptr() for t in groups], dtype=torch.int64)
lengths = torch.tensor([t.numel() for t in groups], dtype=torch.int32)
out = torch.zeros(3, 8)

args = (table, lengths, out, out.stride(0))
kwargs = {"BLOCK": 8}
