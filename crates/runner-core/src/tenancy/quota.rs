//! Whether a tenant may start one more session: its tier's limits against
//! what it holds now. Pure: the registry counts the usage under the same
//! lock it admits under, so two concurrent creates never both take the last
//! place.

use serde::Serialize;

use super::tiers::TierLimits;

/// What a tenant holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub sessions: u64,
    pub watch_sessions: u64,
    pub suspended_sessions: u64,
    /// Summed CPU limits of live sessions, millicores.
    pub cpu: u64,
    /// Summed memory limits of live sessions, bytes.
    pub memory: u64,
    pub session_seconds_today: u64,
}

/// What one session holds while it is live: the ceilings the backend runs it
/// under (zero where the backend sets none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionResources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// The session a tenant asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub watch: bool,
    pub resources: SessionResources,
}

/// A refusal: `429 quota_exceeded` naming the quota, its value and the use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct QuotaExceeded {
    /// The limit's name as the tiers file spells it.
    pub quota: &'static str,
    pub limit: u64,
    pub used: u64,
    pub message: String,
}

/// Admits `ask` under `limits` with `usage`, or names the first quota it
/// would break.
pub fn check(limits: &TierLimits, usage: &Usage, ask: &Ask) -> Result<(), QuotaExceeded> {
    let refuse = |quota: &'static str, limit: u64, used: u64, what: &str| QuotaExceeded {
        quota,
        limit,
        used,
        message: format!("your tenant's quota '{quota}' is {limit} and it uses {used}: {what}"),
    };
    if let Some(limit) = limits.sessions
        && usage.sessions + 1 > limit
    {
        return Err(refuse(
            "sessions",
            limit,
            usage.sessions,
            "stop a session to start another",
        ));
    }
    if ask.watch {
        if let Some(limit) = limits.watch_sessions
            && usage.watch_sessions + 1 > limit
        {
            return Err(refuse(
                "watchSessions",
                limit,
                usage.watch_sessions,
                "stop or let a watch session suspend to start another",
            ));
        }
        if let Some(limit) = limits.suspended_sessions
            && usage.suspended_sessions >= limit
        {
            return Err(refuse(
                "suspendedSessions",
                limit,
                usage.suspended_sessions,
                "delete a suspended watch session to start another",
            ));
        }
    }
    if let Some(limit) = limits.cpu
        && usage.cpu + ask.resources.cpu_millis > limit
    {
        return Err(refuse(
            "cpu",
            limit,
            usage.cpu,
            &format!(
                "a new session needs {} more (millicores)",
                ask.resources.cpu_millis
            ),
        ));
    }
    if let Some(limit) = limits.memory
        && usage.memory + ask.resources.memory_bytes > limit
    {
        return Err(refuse(
            "memory",
            limit,
            usage.memory,
            &format!(
                "a new session needs {} more (bytes)",
                ask.resources.memory_bytes
            ),
        ));
    }
    if let Some(limit) = limits.session_seconds_per_day
        && usage.session_seconds_today >= limit
    {
        return Err(refuse(
            "sessionSecondsPerDay",
            limit,
            usage.session_seconds_today,
            "the allowance renews at midnight UTC",
        ));
    }
    Ok(())
}

/// Whether a suspended watch session may be resumed: it becomes live again,
/// so the live and watch limits apply (the suspended one it frees does not
/// count).
pub fn check_resume(
    limits: &TierLimits,
    usage: &Usage,
    resources: SessionResources,
) -> Result<(), QuotaExceeded> {
    let mut usage = *usage;
    usage.suspended_sessions = 0;
    usage.session_seconds_today = 0;
    check(
        limits,
        &usage,
        &Ask {
            watch: true,
            resources,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Ask {
        Ask {
            watch: false,
            resources: SessionResources {
                cpu_millis: 500,
                memory_bytes: 1 << 30,
            },
        }
    }

    #[test]
    fn exactly_at_a_limit_is_admitted_and_one_over_is_not() {
        let limits = TierLimits {
            sessions: Some(2),
            ..TierLimits::default()
        };
        let one = Usage {
            sessions: 1,
            ..Usage::default()
        };
        assert_eq!(check(&limits, &one, &run()), Ok(()));
        let two = Usage {
            sessions: 2,
            ..Usage::default()
        };
        let refused = check(&limits, &two, &run()).unwrap_err();
        assert_eq!(
            (refused.quota, refused.limit, refused.used),
            ("sessions", 2, 2)
        );
        assert_eq!(
            refused.message,
            "your tenant's quota 'sessions' is 2 and it uses 2: stop a session to start another"
        );
    }

    #[test]
    fn cpu_and_memory_count_what_the_new_session_would_add() {
        let limits = TierLimits {
            cpu: Some(1000),
            memory: Some(3 << 30),
            ..TierLimits::default()
        };
        let usage = Usage {
            cpu: 500,
            memory: 1 << 30,
            ..Usage::default()
        };
        assert_eq!(check(&limits, &usage, &run()), Ok(()));
        let usage = Usage { cpu: 600, ..usage };
        assert_eq!(check(&limits, &usage, &run()).unwrap_err().quota, "cpu");
        let usage = Usage {
            cpu: 0,
            memory: (2 << 30) + 1,
            ..usage
        };
        assert_eq!(check(&limits, &usage, &run()).unwrap_err().quota, "memory");
    }

    #[test]
    fn watch_limits_apply_to_watch_sessions_only() {
        let limits = TierLimits {
            watch_sessions: Some(1),
            suspended_sessions: Some(1),
            ..TierLimits::default()
        };
        let usage = Usage {
            watch_sessions: 1,
            suspended_sessions: 1,
            ..Usage::default()
        };
        assert_eq!(check(&limits, &usage, &run()), Ok(()));
        let watch = Ask {
            watch: true,
            ..run()
        };
        assert_eq!(
            check(&limits, &usage, &watch).unwrap_err().quota,
            "watchSessions"
        );
        let usage = Usage {
            watch_sessions: 0,
            ..usage
        };
        assert_eq!(
            check(&limits, &usage, &watch).unwrap_err().quota,
            "suspendedSessions"
        );
        assert_eq!(
            check_resume(&limits, &usage, SessionResources::default()),
            Ok(())
        );
    }

    #[test]
    fn a_days_allowance_used_up_refuses_new_sessions() {
        let limits = TierLimits {
            session_seconds_per_day: Some(3600),
            ..TierLimits::default()
        };
        let usage = Usage {
            session_seconds_today: 3600,
            ..Usage::default()
        };
        let refused = check(&limits, &usage, &run()).unwrap_err();
        assert_eq!(refused.quota, "sessionSecondsPerDay");
    }

    #[test]
    fn no_limits_admit_anything() {
        let usage = Usage {
            sessions: 10_000,
            cpu: u64::MAX / 2,
            ..Usage::default()
        };
        assert_eq!(check(&TierLimits::default(), &usage, &run()), Ok(()));
    }
}
