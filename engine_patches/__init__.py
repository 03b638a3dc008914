"""SGLang patches that make speculative decoding bit-exact and observable.

One module per patch (`gdn_verify_as_decode`, `verify_attention_as_decode_rows`,
`gemm_routing`, `telemetry`); `registry` applies and removes them, `check` is
`specdash patches check`, `diffs/` holds the exactness patches as unified diffs.
"""
