//! Which shard a schedule belongs to, when replicas share the fires
//! (`BELFRY_SHARDING`): a stable hash of its name modulo the shard count.
//!
//! The hash is 32-bit FNV-1a over the name's UTF-8 bytes. It is stable
//! across builds, platforms and processes (unlike the standard library's
//! randomly seeded hasher) and simple enough to compute in SQL too: the
//! Postgres function `belfry_shard_key(name)` (migration
//! `20261204000001_shard_leases.sql`) is the same function, so a replica
//! can load the schedules of the shards it owns with a `WHERE` clause. A
//! test compares both on the same names.

/// FNV-1a's 32-bit offset basis.
const OFFSET_BASIS: u32 = 2_166_136_261;
/// FNV-1a's 32-bit prime.
const PRIME: u32 = 16_777_619;

/// The 32-bit FNV-1a hash of `name`'s UTF-8 bytes (what the column
/// `schedules.shard_key` holds).
pub fn shard_key(name: &str) -> u32 {
    name.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(PRIME)
    })
}

/// The shard of the schedule `name` among `shards` (at least 1; 0 is read
/// as 1, so every name is in shard 0).
pub fn shard_of(name: &str, shards: u32) -> u32 {
    shard_key(name) % shards.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_reference_values() {
        // The published FNV-1a 32-bit test values.
        assert_eq!(shard_key(""), 0x811c_9dc5);
        assert_eq!(shard_key("a"), 0xe40c_292c);
        assert_eq!(shard_key("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn names_spread_over_the_shards() {
        let shards = 256;
        let mut counts = vec![0u32; shards as usize];
        for i in 0..25_600 {
            counts[shard_of(&format!("report-{i}"), shards) as usize] += 1;
        }
        // 100 per shard on average; no shard empty or three times full.
        assert!(counts.iter().all(|&c| c > 30 && c < 300), "{counts:?}");
        assert_eq!(shard_of("anything", 0), 0);
    }
}
