//! Small deterministic pseudo-random numbers for the emulator's loss models.
//!
//! The same seed must give the same drop decisions on every run and every machine, so
//! this is a fixed algorithm (SplitMix64) rather than whatever a crate picks by default.

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, statistically fine for loss draws.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (p ≤ 0 never, p ≥ 1 always).
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

/// The SplitMix64 finaliser: a bijective avalanche of one 64-bit word.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derives an independent seed for a named sub-stream (e.g. one link direction), so
/// adding a link does not shift the random numbers every other link sees.
pub fn derive_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a over the name, then mixed with the seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix64(seed ^ mix64(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn chance_matches_probability() {
        let mut r = SplitMix64::new(42);
        let n = 200_000;
        let hits = (0..n).filter(|_| r.chance(0.01)).count();
        let rate = hits as f64 / n as f64;
        assert!((rate - 0.01).abs() < 0.001, "rate {rate}");
    }

    #[test]
    fn derived_seeds_differ_by_name() {
        assert_ne!(derive_seed(1, "wan/down"), derive_seed(1, "wan/up"));
        assert_eq!(derive_seed(1, "wan/down"), derive_seed(1, "wan/down"));
    }
}
