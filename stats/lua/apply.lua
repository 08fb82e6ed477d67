-- apply: apply one statistics delta to one shard (apply_delta.lua is prepended).
-- KEYS[1..5] the shard's statistics keys, in the order of stats_keys
-- ARGV[1] n, then the n delta arguments (delta_args)
-- Reply: n + 2, the index after the delta.
return apply_stats(1, 1)
