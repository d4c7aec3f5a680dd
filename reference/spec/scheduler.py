"""Reference scheduler: the policy ``kernels.spec.scheduler`` documents, restated with plain lists.

Blocks: each pool is a list of free block ids (front first; 0 is the null block, never free).
The target pool's prefix cache maps the full token prefix a block ends (a tuple) to the block;
the draft pool has none. Requests are dicts.
"""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Pools:
    def __init__(self, c: dict, q: int):
        self.c, self.q = c, q
        self.free_t = list(range(1, c["target_num_blocks"]))
        self.free_d = list(range(1, c["draft_num_blocks"]))
        self.users = {}  # target block -> number of requests holding it
        self.cache = {}  # token prefix -> target block holding its last full block
        self.prefix_of = {}  # target block -> its prefix, while cached
        self.freed_d = []  # draft blocks freed since the engine last poisoned them

    def pop_target(self) -> int:
        block = self.free_t.pop(0)
        if block in self.prefix_of:  # evicted from the cache
            del self.cache[self.prefix_of.pop(block)]
        self.users[block] = 1
        return block

    def hits(self, tokens: list[int]) -> list[int]:
        bs, found = self.c["target_block_size"], []
        for i in range((len(tokens) - 1) // bs):
            block = self.cache.get(tuple(tokens[:(i + 1) * bs]))
            if block is None:
                break
            found.append(block)
        return found

    def needed(self, req: dict, num_tokens: int) -> tuple[int, int]:
        t = ceil_div(num_tokens, self.c["target_block_size"]) - len(req["target_blocks"])
        d = ceil_div(num_tokens + self.q, self.c["draft_block_size"]) - len(req["draft_blocks"])
        return max(t, 0), max(d, 0)

    def grow(self, req: dict, num_tokens: int) -> bool:
        t, d = self.needed(req, num_tokens)
        if t > len(self.free_t) or d > len(self.free_d):
            return False
        req["target_blocks"] += [self.pop_target() for _ in range(t)]
        req["draft_blocks"] += [self.free_d.pop(0) for _ in range(d)]
        return True

    def free(self, req: dict) -> None:
        for block in reversed(req["target_blocks"]):
            self.users[block] -= 1
            if self.users[block] == 0:
                self.free_t.append(block)
        self.free_d += list(reversed(req["draft_blocks"]))
        self.freed_d += req["draft_blocks"]
        req["target_blocks"], req["draft_blocks"] = [], []

    def register(self, req: dict) -> None:
        """Cache every block whose tokens are all computed, unless its prefix or the block is cached."""
        bs = self.c["target_block_size"]
        for i in range(min(req["num_computed"] // bs, len(req["target_blocks"]))):
            prefix, block = tuple(req["tokens"][:(i + 1) * bs]), req["target_blocks"][i]
            if prefix not in self.cache and block not in self.prefix_of:
                self.cache[prefix] = block
                self.prefix_of[block] = prefix


def prefilling(req: dict) -> bool:
    return len(req["tokens"]) - req["num_computed"] > 1


class Scheduler:
    def __init__(self, c: dict, q: int, requests: list[dict]):
        self.c = c
        self.pools = Pools(c, q)
        self.requests = requests
        self.waiting, self.running, self.finished = [], [], set()

    def schedule(self, step: int):
        """Returns (batch [(request, tokens)], admitted requests, released request ids)."""
        self.waiting += [r for r in self.requests if r["arrival"] == step]
        released, self.finished = self.finished, set()
        budget = self.c["max_num_batched_tokens"]
        batch, preempted = [], False
        for req in list(self.running):
            if budget == 0 or req not in self.running:
                break
            if prefilling(req):
                n = min(len(req["tokens"]) - req["num_computed"], budget)
            else:
                n = min(1 + len(req["drafts"]), budget)
                req["drafts"] = req["drafts"][:n - 1]
            while not self.pools.grow(req, req["num_computed"] + n):
                victim = self.running.pop()
                self.pools.free(victim)
                victim["num_computed"], victim["drafts"] = 0, []
                self.waiting.insert(0, victim)
                released.add(victim["req_id"])
                preempted = True
                if victim is req:
                    break
            if req in self.running:
                batch.append((req, n))
                budget -= n
        admitted = []
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.c["max_num_reqs"]:
            req = self.waiting[0]
            hits = self.pools.hits(req["tokens"])
            cached = len(hits) * self.c["target_block_size"]
            n = min(len(req["tokens"]) - cached, budget)
            t, d = self.pools.needed(req, cached + n)
            t -= len(hits)
            free_after_hits = len(self.pools.free_t) - len([b for b in hits if b in self.pools.free_t])
            if t > free_after_hits or d > len(self.pools.free_d):
                break
            for block in hits:
                if block in self.pools.free_t:
                    self.pools.free_t.remove(block)
                self.pools.users[block] = self.pools.users.get(block, 0) + 1
            req["target_blocks"] = hits + [self.pools.pop_target() for _ in range(t)]
            req["draft_blocks"] = [self.pools.free_d.pop(0) for _ in range(d)]
            req["num_computed"] = req["num_cached"] = cached
            self.waiting.pop(0)
            self.running.append(req)
            admitted.append(req)
            batch.append((req, n))
            budget -= n
        decodes = [item for item in batch if not prefilling(item[0])]
        return decodes + [item for item in batch if prefilling(item[0])], admitted, released

    def finish_step(self) -> None:
        for req in list(self.running):
            self.pools.register(req)
            if req["finished"]:
                self.running.remove(req)
                self.pools.free(req)
                self.finished.add(req["req_id"])
