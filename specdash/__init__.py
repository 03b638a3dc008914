"""specdash: a live, bit-exact speculative-decoding profiler (see README.md)."""
