//! Delivering one event: the signed request, what each answer means, and the
//! backoff between attempts.

use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use time::OffsetDateTime;
use time::macros::format_description;
use tracing::{debug, warn};

use super::config::WebhookConfig;
use super::event::{CLOUDEVENTS_CONTENT_TYPE, LifecycleEvent, cloud_event, new_event_id};
use super::signature::{SIGNATURE_HEADER, TIMESTAMP_HEADER, sign};

/// How events are queued and retried. [`Default`] is the production policy;
/// tests shorten the waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryPolicy {
    /// Events waiting at once; past it the oldest waiting one is dropped.
    pub queue_capacity: usize,
    /// Attempts per event, the first included.
    pub max_attempts: u32,
    /// How long one request may take, answer included.
    pub request_timeout: Duration,
    /// The wait after the first failed attempt; it doubles per failure.
    pub first_backoff: Duration,
    /// The longest wait between attempts, `Retry-After` included.
    pub max_backoff: Duration,
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        Self {
            queue_capacity: 1_000,
            max_attempts: 8,
            request_timeout: Duration::from_secs(10),
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    Delivered,
    /// Refused for good (a 4xx other than 408 and 429, a redirect).
    Refused(StatusCode),
    /// Worth another attempt, after `retry_after` when the receiver asked.
    Retry {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// What an answer with `status` and `headers` means.
pub(super) fn judge(status: StatusCode, headers: &HeaderMap, cap: Duration) -> Verdict {
    if status.is_success() {
        return Verdict::Delivered;
    }
    if status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
    {
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| retry_after(value, OffsetDateTime::now_utc()))
            .map(|wait| wait.min(cap));
        return Verdict::Retry {
            reason: format!("answered {status}"),
            retry_after,
        };
    }
    Verdict::Refused(status)
}

/// A `Retry-After` value: delay seconds, or an HTTP date (`now` to it).
pub(super) fn retry_after(value: &str, now: OffsetDateTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(
            value
                .parse::<u64>()
                .map_or(Duration::MAX, Duration::from_secs),
        );
    }
    let format = format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let at = time::PrimitiveDateTime::parse(value, &format)
        .ok()?
        .assume_utc();
    let wait = at - now;
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

/// The wait after `failures` failed attempts: `first * 2^(failures-1)`,
/// capped at `max`, of which a random half is taken off so that runners
/// retrying together spread out.
pub(super) fn backoff(policy: &DeliveryPolicy, failures: u32) -> Duration {
    let doubling = 2u32.saturating_pow(failures.saturating_sub(1));
    let full = policy
        .first_backoff
        .saturating_mul(doubling)
        .min(policy.max_backoff);
    let half = full / 2;
    let jitter_ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
    half + Duration::from_millis(rand::random_range(0..=jitter_ms))
}

/// What delivering one event came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Delivered,
    Dropped,
}

/// Delivers `event`, retrying as the policy allows; `failed` is called after
/// each failed attempt. The CloudEvents `id` is the same on every attempt,
/// so a receiver that saw an attempt whose answer was lost can tell the
/// retry is the same event.
pub(super) async fn deliver(
    client: &reqwest::Client,
    config: &WebhookConfig,
    policy: &DeliveryPolicy,
    event: &LifecycleEvent,
    failed: impl Fn(),
) -> Outcome {
    let id = new_event_id();
    let event_type = event.kind.event_type();
    let body = Bytes::from(cloud_event(event, &id).to_string());
    let attempts = policy.max_attempts.max(1);
    for attempt in 1..=attempts {
        let timestamp = OffsetDateTime::now_utc().unix_timestamp();
        let Some(signature) = sign(&config.secret, timestamp, &body) else {
            warn!(session = %event.session_id, event = event_type, "webhook event dropped: it could not be signed");
            return Outcome::Dropped;
        };
        let sent = client
            .post(config.url.clone())
            .header(CONTENT_TYPE, CLOUDEVENTS_CONTENT_TYPE)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(SIGNATURE_HEADER, signature)
            .timeout(policy.request_timeout)
            .body(body.clone())
            .send()
            .await;
        let verdict = match sent {
            Ok(response) => judge(response.status(), response.headers(), policy.max_backoff),
            Err(err) if err.is_builder() => {
                warn!(session = %event.session_id, event = event_type, error = %err, "webhook event dropped: the request could not be built");
                return Outcome::Dropped;
            }
            Err(err) => Verdict::Retry {
                reason: if err.is_timeout() {
                    "timed out".to_owned()
                } else {
                    error_chain(&err)
                },
                retry_after: None,
            },
        };
        match verdict {
            Verdict::Delivered => {
                debug!(session = %event.session_id, event = event_type, attempt, "webhook event delivered");
                return Outcome::Delivered;
            }
            Verdict::Refused(status) => {
                warn!(session = %event.session_id, event = event_type, %status, "webhook event dropped: the receiver refused it");
                return Outcome::Dropped;
            }
            Verdict::Retry {
                reason,
                retry_after,
            } => {
                failed();
                if attempt == attempts {
                    warn!(session = %event.session_id, event = event_type, attempts, last = %reason, "webhook event dropped: every attempt failed");
                    return Outcome::Dropped;
                }
                let wait = retry_after.unwrap_or_else(|| backoff(policy, attempt));
                debug!(session = %event.session_id, event = event_type, attempt, %reason, wait_ms = wait.as_millis() as u64, "webhook delivery failed; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
    Outcome::Dropped
}

/// An error with its causes (`error sending request: connection refused`),
/// never the URL, whose query may carry credentials.
fn error_chain(err: &reqwest::Error) -> String {
    let mut text = String::from(if err.is_connect() {
        "could not connect"
    } else if err.is_body() || err.is_decode() {
        "the answer could not be read"
    } else {
        "the request failed"
    });
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(retry_after: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from_str(value).expect("value"));
        }
        headers
    }

    #[test]
    fn answers_are_judged_by_status() {
        let cap = Duration::from_secs(60);
        for status in [200, 201, 204] {
            let status = StatusCode::from_u16(status).expect("status");
            assert_eq!(judge(status, &headers(None), cap), Verdict::Delivered);
        }
        for status in [301, 400, 401, 403, 404, 410, 413, 422] {
            let status = StatusCode::from_u16(status).expect("status");
            assert_eq!(judge(status, &headers(None), cap), Verdict::Refused(status));
        }
        for status in [408, 429, 500, 502, 503, 504] {
            let status = StatusCode::from_u16(status).expect("status");
            assert!(matches!(
                judge(status, &headers(None), cap),
                Verdict::Retry {
                    retry_after: None,
                    ..
                }
            ));
        }
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let cap = Duration::from_secs(60);
        let judged = |value| judge(StatusCode::SERVICE_UNAVAILABLE, &headers(Some(value)), cap);
        let wait = |verdict| match verdict {
            Verdict::Retry { retry_after, .. } => retry_after,
            other => panic!("not a retry: {other:?}"),
        };
        assert_eq!(wait(judged("7")), Some(Duration::from_secs(7)));
        assert_eq!(wait(judged("3600")), Some(cap));
        assert_eq!(wait(judged("99999999999999999999999")), Some(cap));
        assert_eq!(wait(judged("soon")), None);
        assert_eq!(wait(judged("-1")), None);
    }

    #[test]
    fn retry_after_reads_http_dates() {
        let now = OffsetDateTime::from_unix_timestamp(1_445_412_480).expect("time");
        // Wed, 21 Oct 2015 07:28:00 GMT is 1445412480.
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("21 Oct 2015", now), None);
    }

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter() {
        let policy = DeliveryPolicy::default();
        for (failures, full) in [(1, 1), (2, 2), (3, 4), (4, 8), (6, 32), (7, 60), (40, 60)] {
            let full = Duration::from_secs(full);
            for _ in 0..50 {
                let wait = backoff(&policy, failures);
                assert!(wait >= full / 2 && wait <= full, "{failures}: {wait:?}");
            }
        }
    }
}
