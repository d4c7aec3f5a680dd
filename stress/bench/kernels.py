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
    return (f"{name:44} {nbytes / 1e6:9.1f} MB {kernel_ms * 1e3:9.1f} us {gbs:8.0f} GB/s "
            f"{copy_ms / kernel_ms:9.2f}x {eager_ms / kernel_ms:9.2f}x")


def gpu_rows() -> list[str]:
    dev = runtime.device()
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = [f"{'kernel':44} {'bytes':>12} {'time':>12} {'achieved':>13} {'vs copy':>10} {'vs eager':>10}"]

    slots, width, batch = 8192, 4096, 4096
    persistent = torch.randint(1, 1 << 30, (slots, width), dtype=torch.int32, generator=gen).to(dev)
    idx = torch.randperm(slots, generator=gen)[:batch].to(torch.int32).to(dev)
    out = torch.empty(batch, width, dtype=torch.int32, device=dev)
    nbytes = 2 * batch * width * 4
    idx64 = idx.long()
    rows.append(_row("gather_block_tables", nbytes,
                     _time_ms(lambda: block_table.gather_block_tables(persistent, idx, out)), _copy_ms(nbytes, dev),
                     _time_ms(lambda: torch.index_select(persistent, 0, idx64, out=out))))

    rows += slot_mapping_rows(dev, gen)

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


def slot_mapping_rows(dev, gen, tokens: int = 1 << 22, rows_b: int = 1024, table_width: int = 4096) -> list[str]:
    """compute_slot_mappings against its eager equivalent in three workloads: random positions over each row's
    whole table (every token reads its own table entry: a gather), prefill rows of consecutive positions (16
    tokens share an entry), and 1,024 decode rows of one token (a launch-bound batch). bytes = positions in,
    slots out, one table entry per token."""
    bs, out = 16, []
    for name in ("random positions", "prefill rows", f"decode, {rows_b:,} rows"):
        per_row = 1 if name.startswith("decode") else tokens // rows_b
        table = torch.randint(1, 1 << 20, (rows_b, table_width), dtype=torch.int32, generator=gen).to(dev)
        qsl = (torch.arange(rows_b + 1, dtype=torch.int32) * per_row).to(dev)
        if name == "prefill rows":
            starts = torch.randint(0, table_width * bs - per_row, (rows_b, 1), generator=gen)
            positions = (starts + torch.arange(per_row)).flatten().to(dev)
        else:
            positions = torch.randint(0, table_width * bs, (rows_b * per_row,), generator=gen).to(dev)
        slot_out = torch.empty(positions.numel(), dtype=torch.int64, device=dev)
        row_of_token = torch.repeat_interleave(torch.arange(rows_b, device=dev), per_row)

        def eager_slots(table=table, positions=positions, slot_out=slot_out, row_of_token=row_of_token):
            blk = table[row_of_token, positions // bs].long()
            slot_out.copy_(torch.where(blk != 0, blk * bs + positions % bs, -1))

        nbytes = positions.numel() * (8 + 8 + 4)
        kernel_ms = _time_ms(lambda table=table, qsl=qsl, positions=positions, slot_out=slot_out:
                             block_table.compute_slot_mappings(table, qsl, positions, bs, slot_out))
        by_kernel = slot_out.clone()
        eager_ms = _time_ms(eager_slots)
        if not torch.equal(by_kernel, slot_out):
            raise AssertionError(f"compute_slot_mappings ({name}): the eager equivalent computes other slots")
        out.append(_row(f"compute_slot_mappings ({name})", nbytes, kernel_ms, _copy_ms(nbytes, dev), eager_ms))
    return out


def kv_write_row(dev, gen) -> str:
    """write_kv of 32k tokens (8 KV heads x 128, bf16) to distinct random slots, against index_copy_."""
    from kernels.kv_cache import write_kv

    tokens, heads, dim, bs = 32768, 8, 128, 16
    key = torch.randn(tokens, heads, dim, generator=gen).to(torch.bfloat16).to(dev)
    value = torch.randn(tokens, heads, dim, generator=gen).to(torch.bfloat16).to(dev)
    num_blocks = 2 * tokens // bs
    k_cache = torch.zeros(num_blocks, bs, heads, dim, dtype=torch.bfloat16, device=dev)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(num_blocks * bs, generator=gen)[:tokens].to(dev)
    nbytes = 2 * 2 * key.numel() * key.element_size()  # K and V, read once and written once

    def indexed_copy():
        k_cache.view(-1, heads, dim).index_copy_(0, slots, key)
        v_cache.view(-1, heads, dim).index_copy_(0, slots, value)

    return _row("write_kv", nbytes, _time_ms(lambda: write_kv(key, value, slots, k_cache, v_cache)),
                _copy_ms(nbytes, dev), _time_ms(indexed_copy))


def sampling_rows(dev, gen) -> list[str]:
    """gumbel_sample over 128 rows of a 128k vocabulary (float32 logits read once), against a bare
    ``torch.argmax`` over the same logits, which reads as much and draws no noise; and the noise alone, drawn by
    the same programs without reading a logit (``stress.bench.noise_floor``)."""
    from kernels.sampling import gumbel_sample
    from stress.bench.noise_floor import noise_max

    rows, vocab = 128, 1 << 17
    logits = torch.randn(rows, vocab, generator=gen).to(dev)
    idx = torch.arange(rows, dtype=torch.int32, device=dev)
    seeds = torch.arange(rows, dtype=torch.int64, device=dev)
    positions = torch.arange(rows, dtype=torch.int64, device=dev) * 7
    nbytes = logits.numel() * 4
    argmax_ms = _time_ms(lambda: torch.argmax(logits, dim=-1))
    out = []
    for name, temp in (("gumbel_sample (T=1)", 1.0), ("gumbel_sample (greedy)", 0.0)):
        temperature = torch.full((rows,), temp, device=dev)
        kernel_ms = _time_ms(lambda t=temperature: gumbel_sample(logits, idx, t, seeds, positions))
        out.append(_row(name, nbytes, kernel_ms, _copy_ms(nbytes, dev), argmax_ms)
                   + f"   (bare argmax {argmax_ms * 1e3:.1f} us: {kernel_ms / argmax_ms:.2f}x its time)")
    noise = torch.empty(rows * 512, device=dev)
    noise_ms = _time_ms(lambda: noise_max(noise, rows, vocab))
    out.append(f"{'the noise alone (no logits read)':44} {'':>12} {noise_ms * 1e3:9.1f} us   "
               f"{noise_ms / argmax_ms:.2f}x the bare argmax: a floor for gumbel_sample at a temperature")
    return out


def eager_verify(target, drafts, draft_probs_logits, temp, u, noise):
    """PyTorch eager verification of every request (probabilistic, draft logits given): softmax of target and
    draft, the accept test at each draft, the first rejection, a residual Gumbel-max resample and the bonus."""
    p = torch.softmax(target / temp, dim=-1)
    q = torch.softmax(draft_probs_logits / temp, dim=-1)
    k = drafts.shape[1]
    p_x = p[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    accepted = (p_x >= u * q_x).int().cumprod(dim=1)
    num_accepted = accepted.sum(dim=1)
    residual = (p[:, :k] - q).clamp_min(0)
    resampled = torch.argmax(residual.log() + noise[:, :k], dim=-1)
    bonus = torch.argmax(p[:, k].log() + noise[:, k], dim=-1)
    tokens = torch.cat([torch.where(accepted.bool(), drafts, resampled), bonus.unsqueeze(1)], dim=1)
    return tokens, num_accepted


def verify_row(dev, gen) -> str:
    """verify of 64 requests x 4 drafts with draft logits at a 128k vocabulary against ``eager_verify``;
    bytes = target (k+1 rows) and draft logits (k rows), each read once."""
    from kernels.rejection import verify

    batch, k, vocab = 64, 4, 1 << 17
    target = torch.randn(batch, k + 1, vocab, generator=gen).to(dev)
    draft_logits = torch.randn(batch, k, vocab, generator=gen).to(dev)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen).to(dev)
    idx = torch.arange(batch, dtype=torch.int32, device=dev)
    temperature = torch.ones(batch, device=dev)
    seeds = torch.arange(batch, dtype=torch.int64, device=dev)
    positions = torch.arange(batch, dtype=torch.int64, device=dev) * 5
    out_tokens = torch.empty(batch, k + 1, dtype=torch.int64, device=dev)
    num_sampled = torch.empty(batch, dtype=torch.int32, device=dev)
    num_rejected = torch.empty_like(num_sampled)
    u = torch.rand(batch, k, generator=gen).to(dev)
    noise = -torch.log(-torch.log(torch.rand(batch, k + 1, vocab, generator=gen))).to(dev)
    nbytes = (target.numel() + draft_logits.numel()) * 4
    kernel_ms = _time_ms(lambda: verify(target, drafts, idx, temperature, seeds, positions, out_tokens, num_sampled,
                                        num_rejected, draft_logits=draft_logits))
    eager_ms = _time_ms(lambda: eager_verify(target, drafts, draft_logits, 1.0, u, noise))
    return _row("verify (T=1, draft logits)", nbytes, kernel_ms, _copy_ms(nbytes, dev), eager_ms)


def _graph_ms(fn) -> float:
    """GPU time of one CUDA-graph replay of ``fn`` (as the draft runs), L2 flushed before each replay."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _time_ms(graph.replay)


BATCH, KV_HEADS, GROUP, HEAD_DIM, BLOCK = 4, 8, 8, 128, 16


def _attention_row(dev, gen, queries: int, context: int) -> str:
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernels.attention import paged_attention

    width = context // BLOCK

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).to(dev)

    k_cache = randn(BATCH * width, BLOCK, KV_HEADS, HEAD_DIM)
    v_cache = randn(BATCH * width, BLOCK, KV_HEADS, HEAD_DIM)
    table = torch.randperm(BATCH * width, generator=gen).to(torch.int32).view(BATCH, width).to(dev)
    seq_lens = torch.full((BATCH,), context, dtype=torch.int32, device=dev)
    query_start_loc = torch.arange(BATCH + 1, dtype=torch.int32, device=dev) * queries
    query = randn(BATCH * queries, KV_HEADS * GROUP, HEAD_DIM)
    out = torch.empty_like(query)
    scale = HEAD_DIM ** -0.5
    q4 = query.view(BATCH, queries, KV_HEADS * GROUP, HEAD_DIM).transpose(1, 2)

    def gather(cache):  # [B, H_kv, L, D] through the block table
        return cache[table.long()].flatten(1, 2).transpose(1, 2)

    keys, values = gather(k_cache).contiguous(), gather(v_cache).contiguous()
    kernel_ms = _graph_ms(lambda: paged_attention(query, k_cache, v_cache, table, seq_lens, query_start_loc,
                                                  scale=scale, causal=False, out=out))
    sdpa_ms = _graph_ms(lambda: sdpa(q4, keys, values, scale=scale, enable_gqa=True))
    gather_ms = _graph_ms(lambda: sdpa(q4, gather(k_cache), gather(v_cache), scale=scale, enable_gqa=True))
    nbytes = 2 * keys.numel() * keys.element_size()
    name = f"{'decode' if queries == 1 else 'draft 16 non-causal'} {context // 1024}k"
    return (f"{name:44} {nbytes / 1e6:9.1f} MB {kernel_ms * 1e3:9.1f} us {nbytes / kernel_ms / 1e6:8.0f} GB/s "
            f"{_copy_ms(nbytes, dev) / kernel_ms:9.2f}x {sdpa_ms / kernel_ms:9.2f}x {gather_ms / kernel_ms:14.2f}x")


def attention_rows(dev, gen) -> list[str]:
    """paged_attention over a shuffled block table vs SDPA on the same KV made contiguous, and vs gather +
    SDPA: bf16, 8 KV heads with GQA 8 (64 query heads), head dim 128, 4 requests; decode (1 query) and
    DFlash draft blocks (16 non-causal queries). KV bytes = keys and values, each read once."""
    rows = [f"{'paged_attention':28} {'KV bytes':>12} {'time':>12} {'achieved':>13} {'vs copy':>10} "
            f"{'vs SDPA':>10} {'vs gather+SDPA':>15}"]
    return rows + [_attention_row(dev, gen, queries, context) for queries in (1, 16)
                   for context in (1024, 8192, 32768)]


def stress_throughput() -> None:
    """Cases per second per check in one process, where a case's time goes, and the pool's rate."""
    import os

    from stress.bench import throughput as stress_bench

    cases = int(os.environ.get("SPECSAN_BENCH_CASES", "2"))
    print(f"stress throughput on {runtime.DEVICE}: one process, {cases} timed case(s) per family after one untimed "
          "(compiles); phases as shares of the case time")
    for line in stress_bench.check_rows(runtime.DEVICE, cases):
        print(line, flush=True)
    print(stress_bench.pool_row(runtime.DEVICE), flush=True)


def main() -> None:
    print(f"specsan bench on {runtime.DEVICE}")
    if runtime.DEVICE == "cuda":
        print(torch.cuda.get_device_name())
        print("bytes = bytes read + written; vs copy = time of a device-to-device copy moving as many bytes")
        print("  / kernel time (1.0 = at the bandwidth limit);")
        print("vs eager = PyTorch eager equivalent time / kernel time (above 1 = the kernel is faster)")
        for line in gpu_rows():
            print(line)
        gen = torch.Generator(device="cpu").manual_seed(1)
        print(kv_write_row(runtime.device(), gen))
        print("sampling and verification: vs eager = bare argmax / eager torch verification time / kernel time")
        for line in sampling_rows(runtime.device(), gen):
            print(line)
        print(verify_row(runtime.device(), gen))
        print("attention: CUDA-graph replays; vs SDPA / vs gather+SDPA = their time / paged_attention's")
        for line in attention_rows(runtime.device(), gen):
            print(line)
    else:
        print("bandwidth: not_checked (no GPU: the interpreter's speed says nothing about the kernels')")
    stress_throughput()
    if runtime.DEVICE != "cpu":
        print("tracer overhead: not_checked here (kernels are compiled); `make bench DEVICE=cpu` measures it")
        return
    from stress.bench import trace as trace_bench

    print("\n".join(trace_bench.report()), flush=True)
    print("\n".join(trace_bench.sampler_rows()[0]))

