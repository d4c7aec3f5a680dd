"""The command line, one module per driver: each adds its parsers and runs its commands."""
