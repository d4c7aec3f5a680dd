"""``python -m stress.bench`` (``make bench``): kernel bandwidth ratios, then stress throughput per check."""

from stress.bench.kernels import main

main()
