-- replace: make one shard's statistics exactly the given delta (check --repair).
-- KEYS[1..5] the shard's statistics keys, in the order of stats_keys
-- ARGV[1] n, then the n delta arguments (delta_args) of the recomputed statistics
-- Reply: n + 2. Deleting and re-applying in one script means no reader ever sees the
-- shard's statistics half rebuilt.
-- The delta is planned against an empty shard (every stored value read as absent)
-- before the DEL: malformed arguments or a counter past the guard fail the call while
-- the old statistics are still whole, and the stored values, whatever they hold, are
-- never decoded (a corrupt one is what a replace is for).
local writes, after = stats_plan(1, 1, true)
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
stats_write(writes)
return after
