//! Exponential backoff with full jitter: attempt `n` (0-based) waits `U(0, min(cap,
//! initial · multiplier^n))`.
//!
//! Full jitter rather than a ±10% jitter: when many clients fail together, ±10% keeps
//! their retries in lock-step waves that hit a recovering server all at once; spreading
//! each wait over the whole interval decorrelates them at the same expected cost.

use std::time::Duration;

use crate::config::RetryConfig;

/// The upper bound of the wait before retry number `n` (0-based): `min(cap, initial ·
/// multiplier^n)`, computed without overflow for every `n` ([`crate::pace::grown`]).
pub fn ceiling(config: &RetryConfig, n: u32) -> Duration {
    crate::pace::grown(config.initial_delay_ms, config.multiplier, config.max_delay_ms, n)
}

/// The wait before retry number `n`, given `unit` drawn uniformly from `[0, 1)`.
pub fn full_jitter(config: &RetryConfig, n: u32, unit: f64) -> Duration {
    ceiling(config, n).mul_f64(unit.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn defaults() -> RetryConfig {
        RetryConfig::default()
    }

    #[test]
    fn default_ceilings_double_from_one_second_up_to_a_minute() {
        let c = defaults();
        let ms: Vec<u128> = (0..8).map(|n| ceiling(&c, n).as_millis()).collect();
        assert_eq!(ms, [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000]);
    }

    proptest! {
        #[test]
        fn jitter_stays_within_zero_and_the_ceiling(
            n in 0..=u32::MAX,
            unit in 0.0f64..1.0,
            initial in 0u64..=u64::MAX / 2,
            cap in 0u64..=u64::MAX / 2,
            multiplier in 1.0f64..1000.0,
        ) {
            let c = RetryConfig { initial_delay_ms: initial.min(cap), max_delay_ms: cap, multiplier, ..RetryConfig::default() };
            let d = full_jitter(&c, n, unit);
            let bound = ceiling(&c, n);
            prop_assert!(d <= bound);
            prop_assert_eq!(d, bound.mul_f64(unit), "the draw scales the whole bound");
            prop_assert!(bound <= Duration::from_millis(cap));
            let exact = (initial.min(cap) as f64) * multiplier.powi(n.min(i32::MAX as u32) as i32);
            if exact.is_finite() && exact < cap as f64 {
                // Below the cap the ceiling is the exponential itself (to float precision).
                let got = bound.as_millis() as f64;
                prop_assert!((got - exact).abs() <= 1.0 + exact * 1e-9);
            }
        }

        #[test]
        fn ceilings_never_shrink(n in 0..u32::MAX, multiplier in 1.0f64..10.0) {
            let c = RetryConfig { multiplier, ..defaults() };
            prop_assert!(ceiling(&c, n) <= ceiling(&c, n + 1));
        }
    }
}
