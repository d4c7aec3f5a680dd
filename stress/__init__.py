"""The stress harness: registry-driven replay of seeded cases against CPU references."""
