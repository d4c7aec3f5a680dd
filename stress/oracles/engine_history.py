"""What an engine run did, rebuilt from its step records and the workload alone: each request's tokens
step by step, and which target KV slot holds which token. The engine's own host state (its scheduler,
its requests) is never consulted, so a slip there cannot vouch for itself.

``first_bad_read`` judges the ``kv`` invariant: every target KV slot a step's attention reads (positions
0..seq_len - 1 of each batch row, through its recorded block table) holds the KV of that request's
token at that position, written by an earlier step (a restored prefix: by another request with the same
token there) or by this step's own rows; and no slot is written twice in one step. A block handed back
to the prefix cache after another request overwrote it, or a table entry that names another request's
block, reads KV of other tokens: the lockstep comparison shows such a read only through whatever field it
changes first, this names the read.
"""


class Tokens:
    """Each request's tokens (prompt, then what it emitted), as its batch rows' verification recorded them,
    cut at its length limit as the contract cuts them (docs/contracts/engine.md)."""

    def __init__(self, config: dict, requests: list[dict]):
        max_len = config["scheduler"]["max_model_len"]
        self.limit = [min(len(r["prompt"]) + r["max_new_tokens"], max_len) for r in requests]
        self.of = [list(r["prompt"]) for r in requests]

    def emit(self, record: dict) -> None:
        """Append the step's emitted tokens."""
        for b, req in enumerate(record["batch.request"].tolist()):
            self.of[req] += record["verify.out_tokens"][b, :int(record["verify.num_sampled"][b])].tolist()
            del self.of[req][self.limit[req]:]

    def finished(self, req: int) -> bool:
        return len(self.of[req]) >= self.limit[req]


def _step_reads(record: dict, tokens: Tokens, written: dict, block_size: int) -> str | None:
    """The first read of this step from a slot that does not hold its token, or None."""
    ids, positions = record["target.input_ids"].tolist(), record["target.positions"].tolist()
    slots = record["target.slot_mapping"][:len(ids)].tolist()
    now: dict[int, tuple[int, int]] = {}
    for slot, position, token in zip(slots, positions, ids, strict=True):
        if slot < 0:
            continue
        if slot in now:
            return f"slot {slot} written twice in one step (positions {now[slot][0]} and {position})"
        now[slot] = (position, token)
    written.update(now)
    starts, seq_lens = record["target.query_start_loc"].tolist(), record["target.seq_lens"].tolist()
    table = record["target.block_table"].tolist()
    for b, req in enumerate(record["batch.request"].tolist()):
        first = positions[starts[b]] if starts[b + 1] > starts[b] else seq_lens[b]
        for p in range(seq_lens[b]):
            want = (p, ids[starts[b] + p - first]) if p >= first else (p, tokens.of[req][p])
            slot = table[b][p // block_size] * block_size + p % block_size
            if written.get(slot) != want:
                held = "nothing" if slot not in written else "position {} token {}".format(*written[slot])
                return (f"request {req} (batch row {b}) reads position {p} (token {want[1]}) from slot {slot}, "
                        f"which holds {held}")
    return None


def first_bad_read(config: dict, requests: list[dict], records: list[dict]) -> tuple[int, str] | None:
    """The first step whose target attention read KV not written for what it reads, and why."""
    tokens, written = Tokens(config, requests), {}
    block_size = config["scheduler"]["target_block_size"]
    for step, record in enumerate(records):
        if "target.input_ids" not in record:
            continue
        reason = _step_reads(record, tokens, written, block_size)
        if reason is not None:
            return step, reason
        tokens.emit(record)
    return None
