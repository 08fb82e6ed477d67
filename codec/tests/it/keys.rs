//! The key schema keeps each shard in one Redis Cluster slot.

use std::collections::BTreeSet;

use tranche_codec::{KeyLayout, KeySchema, key_slot};

fn shard_keys(k: &KeySchema, shard: u32) -> Vec<String> {
    let mut keys = vec![
        k.active(shard),
        k.pending(shard),
        k.leases(shard),
        k.runs(shard),
        k.inbox(shard),
        k.completed(shard),
        k.completed_index(shard),
        k.stats(shard, "global"),
        k.stats(shard, "worker:worker1"),
        k.stats(shard, "snapshot:v3"),
    ];
    // Every batch this shard holds among the first few hundred.
    keys.extend(
        (0..300)
            .filter(|&b| k.shard_of_batch(b) == shard)
            .map(|b| k.completed_batch(b)),
    );
    keys
}

#[test]
fn every_key_of_a_shard_hashes_to_one_slot() {
    for (num_shards, layout) in [1, 2, 3, 16, 100, 1024]
        .into_iter()
        .flat_map(|n| [(n, KeyLayout::Plain), (n, KeyLayout::Spread)])
    {
        let k = KeySchema::new("elk", num_shards)
            .expect("valid schema")
            .with_layout(layout);
        for shard in k.shards() {
            let slots: BTreeSet<u16> = shard_keys(&k, shard).iter().map(key_slot).collect();
            assert_eq!(
                slots.len(),
                1,
                "shard {shard} of {num_shards}: slots {slots:?}"
            );
            assert_eq!(slots.first(), Some(&key_slot(k.shard_tag(shard))));
        }
        let globals = [k.workers(), k.plans(), k.meta(), k.dict(), k.dirty()];
        let slots: BTreeSet<u16> = globals.iter().map(key_slot).collect();
        assert_eq!(slots.len(), 1, "global keys of {num_shards}: {slots:?}");
    }
}

#[test]
fn a_pid_its_batch_and_its_index_bit_share_a_shard() {
    let k = KeySchema::new("elk", 16).expect("valid schema");
    for pid in [0, 99, 100, 4970, 49_999, u64::MAX] {
        let shard = k.shard_of(pid);
        let batch_key = k.completed_batch(k.batch_of(pid));
        assert_eq!(
            key_slot(&batch_key),
            key_slot(k.completed_index(shard)),
            "pid {pid}"
        );
        assert_eq!(key_slot(&batch_key), key_slot(k.active(shard)), "pid {pid}");
    }
    assert_eq!(k.completed_batch(497), "{elk:1~49}:completed:batch:497");
}

#[test]
fn shards_spread_over_slots() {
    // Not a requirement of correctness, but 1024 shards crammed into a few slots would
    // defeat the point of sharding: the plain layout's hashes are nearly all distinct,
    // the spread layout's all are (each shard has slots of its own).
    let k = KeySchema::new("elk", 1024)
        .expect("valid schema")
        .with_layout(KeyLayout::Plain);
    let slots: BTreeSet<u16> = k.shards().map(|s| key_slot(k.shard_tag(s))).collect();
    assert!(slots.len() > 950, "{} distinct slots", slots.len());
    let k = k.with_layout(KeyLayout::Spread);
    let slots: BTreeSet<u16> = k.shards().map(|s| key_slot(k.shard_tag(s))).collect();
    assert_eq!(slots.len(), 1024);
}
