"""SGLang patches that make speculative decoding bit-exact and observable.

One module per patch (`lazy_dsa_import`, `memory_pools_in_turn`, `gdn_verify_as_decode`,
`verify_attention_as_decode_rows`, `gemm_routing`, `telemetry`, `dflash_logprobs`); `registry`
is the bookkeeping they are built from (targets, rebindings, per-release variants), `patch_set`
lists them and applies and removes them, `check` is `specdash patches check`, `diffs/` holds
the exactness patches and 0.5.17's DFLASH logprobs as unified diffs.
"""
