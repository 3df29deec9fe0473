//! What a session counts against its owner's tenant: who owns it, the
//! resources it holds while live, and how long it was live today.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::identity::Owner;
use crate::tenancy::SessionResources;

#[derive(Default)]
pub(crate) struct SessionTenancy {
    /// Set once, at admission, before anyone can see the session.
    owner: OnceLock<Owner>,
    resources: OnceLock<SessionResources>,
    clock: Mutex<LiveClock>,
}

/// Seconds a session was live (running or starting, not suspended, not
/// finished) on one UTC day.
#[derive(Default)]
struct LiveClock {
    since: Option<Instant>,
    day: i64,
    seconds: u64,
}

impl SessionTenancy {
    pub(crate) fn set(&self, owner: Option<Owner>, resources: SessionResources) {
        if let Some(owner) = owner {
            let _ = self.owner.set(owner);
        }
        let _ = self.resources.set(resources);
    }

    pub(crate) fn owner(&self) -> Option<&Owner> {
        self.owner.get()
    }

    pub(crate) fn resources(&self) -> SessionResources {
        self.resources.get().copied().unwrap_or_default()
    }

    /// The session became live (admitted, resumed).
    pub(crate) fn went_live(&self) {
        let mut clock = lock(&self.clock);
        if clock.since.is_none() {
            clock.since = Some(Instant::now());
        }
    }

    /// The session stopped being live (finished, suspended).
    pub(crate) fn went_idle(&self) {
        let mut clock = lock(&self.clock);
        if let Some(since) = clock.since.take() {
            let (day, seconds) = today_part(since);
            if clock.day != day {
                clock.day = day;
                clock.seconds = 0;
            }
            clock.seconds += seconds;
        }
    }

    /// Seconds live on `day` (today's, for any other day 0).
    pub(crate) fn seconds_on(&self, day: i64) -> u64 {
        let clock = lock(&self.clock);
        let mut seconds = if clock.day == day { clock.seconds } else { 0 };
        if let Some(since) = clock.since {
            let (today, live) = today_part(since);
            if today == day {
                seconds += live;
            }
        }
        seconds
    }
}

/// Today's UTC day and the whole seconds since `since` that fall on it.
fn today_part(since: Instant) -> (i64, u64) {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let into_today = now.rem_euclid(86_400) as u64;
    (
        now.div_euclid(86_400),
        since.elapsed().as_secs().min(into_today),
    )
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
