//! A seeded pseudo-random sequence (xorshift64) for the project's generated tests and mutation
//! inputs: the same seed gives the same sequence everywhere, so a failing case can be rerun.
//! Not for anything that needs unpredictability.

/// Marsaglia's xorshift64 (shifts 13, 7, 17). A zero state would stay zero: use a non-zero
/// seed.
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The next value of the sequence (the state after one step).
    pub fn next_u64(&mut self) -> u64 {
        let x = &mut self.0;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_sequence_is_xorshift64() {
        let mut r = super::XorShift(1);
        assert_eq!(r.next_u64(), 1082269761);
        assert_eq!(r.next_u64(), 1152992998833853505);
    }
}
