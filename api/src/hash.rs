//! The content hash: names rendered content (ConfigMaps, neuron-monitor configuration
//! files) and seeds the simulator's stable identifiers. Not a security measure.

/// A stable 64-bit FNV-1a hash, hex.
pub fn content_hash(bytes: &[u8]) -> String {
    format!("{:016x}", fnv1a(bytes))
}

/// FNV-1a, 64 bits: stable across releases and platforms (std's hasher is not).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}
