"""What several registry entries share: the oracle map of a bug every device sees as a divergence."""

EVERYWHERE = {"cpu": "divergence", "cuda": "divergence"}
# engine.step's families with temperatures > 0 (seeds, noise, rejections, the logits cache): the path column
# hunts the sampling and verification bugs there first
ENGINE_SAMPLED = ("seeded_sampling", "padded_graphs")
