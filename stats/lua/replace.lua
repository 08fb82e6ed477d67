-- replace: make one shard's statistics exactly the given delta (check --repair).
-- KEYS[1..5] the shard's statistics keys, in the order of stats_keys
-- ARGV[1] n, then the n delta arguments (delta_args) of the recomputed statistics
-- Reply: n + 2. Deleting and re-applying in one script means no reader ever sees the
-- shard's statistics half rebuilt.
-- apply_stats' overflow guard would only run after the DEL here, so its delta half
-- (ARGV[3..5]: count, ids, dur_ms) is checked first: a refused repair keeps the old
-- statistics rather than none.
if ARGV[1] ~= '0' and (#ARGV[3] > 18 or #ARGV[4] > 18 or #ARGV[5] > 18) then
  error('stats: a delta counter reached 10^18; nothing was replaced')
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return apply_stats(1, 1)
