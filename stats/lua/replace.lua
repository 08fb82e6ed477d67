-- replace: make one shard's statistics exactly the given delta (check --repair).
-- KEYS[1..5] the shard's statistics keys, in the order of stats_keys
-- ARGV[1] n, then the n delta arguments (delta_args) of the recomputed statistics
-- Reply: n + 2. Deleting and re-applying in one script means no reader ever sees the
-- shard's statistics half rebuilt.
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return apply_stats(1, 1)
