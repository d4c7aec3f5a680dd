"""``make bench``: each kernel at a large size vs the bandwidth limit and vs PyTorch eager,
all measured in one run. On a machine without a GPU the bandwidth rows are ``not_checked``."""

import torch

from kernels import block_table, runtime


def _time_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200)


def _copy_ms(nbytes: int, device) -> float:
    """A device-to-device copy moving the same bytes (half read, half written): the practical limit."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return _time_ms(lambda: dst.copy_(src))


def _row(name, nbytes, kernel_ms, copy_ms, eager_ms) -> str:
    gbs = nbytes / kernel_ms / 1e6
    return (f"{name:28} {nbytes / 1e6:9.1f} MB {kernel_ms * 1e3:9.1f} us {gbs:8.0f} GB/s "
            f"{copy_ms / kernel_ms:9.2f}x {eager_ms / kernel_ms:9.2f}x")


def gpu_rows() -> list[str]:
    dev = runtime.device()
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = [f"{'kernel':28} {'bytes':>12} {'time':>12} {'achieved':>13} {'vs copy':>10} {'vs eager':>10}"]

    slots, width, batch = 8192, 4096, 4096
    persistent = torch.randint(1, 1 << 30, (slots, width), dtype=torch.int32, generator=gen).to(dev)
    idx = torch.randperm(slots, generator=gen)[:batch].to(torch.int32).to(dev)
    out = torch.empty(batch, width, dtype=torch.int32, device=dev)
    nbytes = 2 * batch * width * 4
    idx64 = idx.long()
    rows.append(_row("gather_block_tables", nbytes,
                     _time_ms(lambda: block_table.gather_block_tables(persistent, idx, out)), _copy_ms(nbytes, dev),
                     _time_ms(lambda: torch.index_select(persistent, 0, idx64, out=out))))

    tokens, bs, table_width = 1 << 22, 16, 4096
    rows_b = 1024
    table = torch.randint(1, 1 << 20, (rows_b, table_width), dtype=torch.int32, generator=gen).to(dev)
    per_row = tokens // rows_b
    qsl = (torch.arange(rows_b + 1, dtype=torch.int32) * per_row).to(dev)
    positions = torch.randint(0, table_width * bs, (tokens,), generator=gen).to(dev)
    slot_out = torch.empty(tokens, dtype=torch.int64, device=dev)
    row_of_token = torch.repeat_interleave(torch.arange(rows_b, device=dev), per_row)

    def eager_slots():
        blk = table[row_of_token, positions // bs].long()
        slot_out.copy_(torch.where(blk != 0, blk * bs + positions % bs, -1))

    nbytes = tokens * (8 + 8 + 4)  # positions in, slots out, one table entry per token
    rows.append(_row("compute_slot_mappings", nbytes,
                     _time_ms(lambda: block_table.compute_slot_mappings(table, qsl, positions, bs, slot_out)),
                     _copy_ms(nbytes, dev), _time_ms(eager_slots)))

    rows_s, width_s, shift = 2048, 16384, 7
    table_s = torch.randint(1, 1 << 30, (rows_s, width_s), dtype=torch.int32, generator=gen).to(dev)
    idx_s = torch.arange(rows_s, dtype=torch.int32, device=dev)
    cached = torch.full((rows_s,), shift * 16, dtype=torch.int32, device=dev)
    seq = torch.full((rows_s,), width_s * 16, dtype=torch.int32, device=dev)
    n = width_s - shift
    nbytes = 2 * rows_s * n * 4

    def eager_shift():
        table_s[:, :n] = table_s[:, shift:shift + n].clone()

    rows.append(_row("shift_block_table_rows", nbytes,
                     _time_ms(lambda: block_table.shift_block_table_rows(table_s, idx_s, cached, seq, 16)),
                     _copy_ms(nbytes, dev), _time_ms(eager_shift)))
    return rows


def main() -> None:
    print(f"specsan bench on {runtime.DEVICE}")
    if runtime.DEVICE == "cuda":
        print(torch.cuda.get_device_name())
        print("bytes = bytes read + written; vs copy = time of a device-to-device copy moving as many bytes")
        print("  / kernel time (1.0 = at the bandwidth limit);")
        print("vs eager = PyTorch eager equivalent time / kernel time (above 1 = the kernel is faster)")
        for line in gpu_rows():
            print(line)
    else:
        print("bandwidth: not_checked (no GPU: the interpreter's speed says nothing about the kernels')")
    if runtime.DEVICE != "cpu":
        print("tracer overhead: not_checked here (kernels are compiled); `make bench DEVICE=cpu` measures it")
        return
    from stress import trace_bench

    print("\n".join(trace_bench.report()), flush=True)
    print("\n".join(trace_bench.sampler_rows()[0]))


if __name__ == "__main__":
    main()
