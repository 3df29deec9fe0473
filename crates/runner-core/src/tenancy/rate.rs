//! Token buckets per principal (or per address, for anonymous clients and
//! requests that carry no identity): `requestsPerMinute` over every `/v1`
//! request, `startsPerMinute` over session creations. A bucket holds a
//! minute's worth and refills continuously (GCRA, as `governor` keeps it):
//! a burst of exactly the limit passes, the next request waits.
//!
//! One keyed limiter per tier and kind; a tier's buckets start full again
//! when the tiers file changes that tier. Buckets that have refilled are
//! dropped by [`RateLimits::forget_idle`], so a table of many principals
//! stays as small as the ones that were busy in the last minute.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use super::tiers::{TierLimits, Tiers};

/// A refusal: `429 rate_limited` with `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("too many {what} from you: at most {limit} a minute; retry in {retry_after_seconds} s")]
pub struct RateLimited {
    pub what: &'static str,
    pub limit: u32,
    pub retry_after_seconds: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateKind {
    Requests,
    Starts,
}

impl RateKind {
    fn what(self) -> &'static str {
        match self {
            RateKind::Requests => "requests",
            RateKind::Starts => "session starts",
        }
    }

    fn limit(self, limits: &TierLimits) -> Option<u32> {
        match self {
            RateKind::Requests => limits.requests_per_minute,
            RateKind::Starts => limits.starts_per_minute,
        }
    }
}

struct Bucket {
    per_minute: u32,
    limiter: DefaultKeyedRateLimiter<String>,
}

/// The buckets of every tier.
#[derive(Default)]
pub struct RateLimits {
    buckets: RwLock<HashMap<(String, RateKind), Arc<Bucket>>>,
}

impl RateLimits {
    /// Takes one token of `kind` for `key` in tier `tier` (whose limits are
    /// `limits`); unlimited tiers always pass.
    pub fn take(
        &self,
        tier: &str,
        limits: &TierLimits,
        kind: RateKind,
        key: &str,
    ) -> Result<(), RateLimited> {
        let Some(per_minute) = kind.limit(limits).and_then(NonZeroU32::new) else {
            return Ok(());
        };
        let bucket = self.bucket(tier, kind, per_minute);
        match bucket.limiter.check_key(&key.to_owned()) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Err(RateLimited {
                    what: kind.what(),
                    limit: per_minute.get(),
                    retry_after_seconds: whole_seconds(wait),
                })
            }
        }
    }

    fn bucket(&self, tier: &str, kind: RateKind, per_minute: NonZeroU32) -> Arc<Bucket> {
        let key = (tier.to_owned(), kind);
        if let Some(bucket) = read(&self.buckets).get(&key)
            && bucket.per_minute == per_minute.get()
        {
            return bucket.clone();
        }
        let mut buckets = write(&self.buckets);
        match buckets.get(&key) {
            Some(bucket) if bucket.per_minute == per_minute.get() => bucket.clone(),
            _ => {
                let bucket = Arc::new(Bucket {
                    per_minute: per_minute.get(),
                    limiter: governor::RateLimiter::keyed(Quota::per_minute(per_minute)),
                });
                buckets.insert(key, bucket.clone());
                bucket
            }
        }
    }

    /// Drops the buckets of tiers `tiers` no longer defines and every key
    /// whose bucket has refilled.
    pub fn forget_idle(&self, tiers: &Tiers) {
        let mut buckets = write(&self.buckets);
        buckets.retain(|(tier, _), _| tiers.tiers.contains_key(tier));
        for bucket in buckets.values() {
            bucket.limiter.retain_recent();
            bucket.limiter.shrink_to_fit();
        }
    }

    /// Keys held across every bucket (for the memory bound's bench and tests).
    pub fn keys(&self) -> usize {
        read(&self.buckets)
            .values()
            .map(|bucket| bucket.limiter.len())
            .sum()
    }
}

/// A wait in whole seconds, at least one (`Retry-After: 0` invites a retry
/// storm).
fn whole_seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0).max(u64::from(wait.is_zero()))
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_minute: u32) -> TierLimits {
        TierLimits {
            requests_per_minute: Some(per_minute),
            starts_per_minute: Some(1),
            ..TierLimits::default()
        }
    }

    #[test]
    fn exactly_the_limit_passes_and_the_next_waits() {
        let rates = RateLimits::default();
        let limits = limits(5);
        for _ in 0..5 {
            assert_eq!(
                rates.take("t", &limits, RateKind::Requests, "alice"),
                Ok(())
            );
        }
        let refused = rates
            .take("t", &limits, RateKind::Requests, "alice")
            .unwrap_err();
        assert_eq!(refused.limit, 5);
        assert!(
            (1..=12).contains(&refused.retry_after_seconds),
            "{refused:?}"
        );
        // Another principal has its own bucket; starts have theirs.
        assert_eq!(rates.take("t", &limits, RateKind::Requests, "bob"), Ok(()));
        assert_eq!(rates.take("t", &limits, RateKind::Starts, "alice"), Ok(()));
        assert!(rates.take("t", &limits, RateKind::Starts, "alice").is_err());
    }

    #[test]
    fn concurrent_bursts_never_overshoot() {
        let rates = Arc::new(RateLimits::default());
        let limits = limits(100);
        let passed = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..50 {
                        if rates.take("t", &limits, RateKind::Requests, "k").is_ok() {
                            passed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        // 400 tries within well under a minute: the minute's 100 and at most
        // the few tokens that refilled meanwhile.
        let passed = passed.into_inner();
        assert!((100..=105).contains(&passed), "{passed}");
    }

    #[test]
    fn unlimited_tiers_keep_no_buckets() {
        let rates = RateLimits::default();
        for key in 0..1000 {
            let key = key.to_string();
            assert_eq!(
                rates.take("t", &TierLimits::default(), RateKind::Requests, &key),
                Ok(())
            );
        }
        assert_eq!(rates.keys(), 0);
    }

    #[test]
    fn a_tier_whose_limit_changed_starts_with_full_buckets() {
        let rates = RateLimits::default();
        assert_eq!(rates.take("t", &limits(1), RateKind::Requests, "a"), Ok(()));
        assert!(
            rates
                .take("t", &limits(1), RateKind::Requests, "a")
                .is_err()
        );
        assert_eq!(rates.take("t", &limits(2), RateKind::Requests, "a"), Ok(()));
    }

    #[test]
    fn retry_after_is_whole_seconds_and_never_zero() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
    }
}
