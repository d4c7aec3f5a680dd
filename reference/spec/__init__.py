"""References for the host-side spec-decode logic."""
