//! `Idempotency-Key` on session creation (both doors): a client that did
//! not see its `201` (a dropped connection, a timeout) sends the same
//! request again with the same key and gets the session it already has,
//! not a second one.
//!
//! A key is scoped to the bearer token that sent it (or to every client
//! of a runner without tokens), holds for [`KEY_LIFETIME`], and at most
//! [`MAX_KEYS`] are kept (the oldest answer goes first). Only a created
//! session is remembered: a refused request leaves no trace, so its retry
//! is decided afresh. Keys live in the runner's memory: a restarted runner
//! has forgotten them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::HeaderMap;
use runner_api::types::SessionCreated;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::error::ApiError;
use super::error_code::ErrorCode;

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// The answer header of a replayed creation.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// How long a key answers with its session.
pub const KEY_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// The most keys remembered at once.
pub const MAX_KEYS: usize = 10_000;
/// The longest key.
pub const MAX_KEY_LENGTH: usize = 255;

/// Whose key: the digest of the bearer token that sent it, if any.
type Scope = Option<[u8; 32]>;

/// A request's body and route, as a key remembers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The route (`POST /v1/sessions`, an app's door) and the body's JSON,
    /// object keys in any order and whitespace aside.
    pub fn of(route: &str, body: Option<&Value>) -> Self {
        let mut hash = Sha256::new();
        hash.update(route.as_bytes());
        hash.update([0]);
        if let Some(body) = body {
            write_canonical(&mut hash, body);
        }
        Self(hash.finalize().into())
    }
}

fn write_canonical(hash: &mut Sha256, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hash.update(b"{");
            for key in keys {
                hash.update(serde_json::to_string(key).unwrap_or_default().as_bytes());
                hash.update(b":");
                write_canonical(hash, &map[key]);
                hash.update(b",");
            }
            hash.update(b"}");
        }
        Value::Array(items) => {
            hash.update(b"[");
            for item in items {
                write_canonical(hash, item);
                hash.update(b",");
            }
            hash.update(b"]");
        }
        other => hash.update(other.to_string().as_bytes()),
    }
}

/// The key a request carries: `None` without the header; a key that is
/// empty, too long or not visible ASCII is refused.
pub fn key_of(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(HEADER) else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|key| {
            !key.is_empty()
                && key.len() <= MAX_KEY_LENGTH
                && key.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidIdempotencyKey,
                format!("Idempotency-Key must be 1 to {MAX_KEY_LENGTH} visible ASCII characters"),
            )
        })?;
    Ok(Some(key.to_owned()))
}

enum Entry {
    /// The first request with this key is still being decided.
    InFlight(Fingerprint),
    Created {
        fingerprint: Fingerprint,
        created: SessionCreated,
        at: Instant,
    },
}

#[derive(Default)]
struct Keys {
    entries: HashMap<(Scope, String), Entry>,
    /// Answered keys, oldest first (for the bound and the lifetime).
    answered: VecDeque<((Scope, String), Instant)>,
}

/// The keys a runner remembers.
#[derive(Default, Clone)]
pub struct IdempotencyKeys {
    keys: Arc<Mutex<Keys>>,
}

/// What a request with a key does.
pub enum Claim {
    /// No session was made under it yet: go on, and [`Pending::created`]
    /// once the session exists.
    Fresh(Pending),
    /// The session this key already made.
    Replay(SessionCreated),
}

impl IdempotencyKeys {
    fn lock(&self) -> MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `key` (sent with `token`) for a request of `fingerprint`.
    pub fn claim(
        &self,
        token: Option<&str>,
        key: String,
        fingerprint: Fingerprint,
    ) -> Result<Claim, ApiError> {
        let scope = token.map(|token| Sha256::digest(token.as_bytes()).into());
        let id = (scope, key);
        let mut keys = self.lock();
        keys.expire(Instant::now());
        match keys.entries.get(&id) {
            Some(Entry::Created {
                fingerprint: known,
                created,
                ..
            }) => {
                if *known == fingerprint {
                    Ok(Claim::Replay(created.clone()))
                } else {
                    Err(reused(&id.1))
                }
            }
            Some(Entry::InFlight(known)) => Err(if *known == fingerprint {
                ApiError::new(
                    ErrorCode::IdempotencyKeyInFlight,
                    format!(
                        "a request with Idempotency-Key '{}' is still being answered; try again shortly",
                        id.1
                    ),
                )
            } else {
                reused(&id.1)
            }),
            None => {
                keys.entries
                    .insert(id.clone(), Entry::InFlight(fingerprint));
                Ok(Claim::Fresh(Pending {
                    keys: self.clone(),
                    id: Some(id),
                    fingerprint,
                }))
            }
        }
    }
}

fn reused(key: &str) -> ApiError {
    ApiError::new(
        ErrorCode::IdempotencyKeyReused,
        format!("Idempotency-Key '{key}' was already used with a different request"),
    )
}

impl Keys {
    fn expire(&mut self, now: Instant) {
        while let Some((id, at)) = self.answered.front() {
            let full = self.entries.len() > MAX_KEYS;
            if !full && now.duration_since(*at) < KEY_LIFETIME {
                break;
            }
            // Only the answer recorded at that time goes (a key answered
            // again later is a newer entry).
            if matches!(self.entries.get(id), Some(Entry::Created { at: known, .. }) if known == at)
            {
                self.entries.remove(id);
            }
            self.answered.pop_front();
        }
    }
}

/// A claimed key whose request is being decided. Dropped without
/// [`Pending::created`] (refused, failed), it frees the key.
pub struct Pending {
    keys: IdempotencyKeys,
    id: Option<(Scope, String)>,
    fingerprint: Fingerprint,
}

impl Pending {
    /// The session the request made: the key's answer from now on.
    pub fn created(mut self, created: &SessionCreated) {
        let Some(id) = self.id.take() else {
            return;
        };
        let at = Instant::now();
        let mut keys = self.keys.lock();
        keys.entries.insert(
            id.clone(),
            Entry::Created {
                fingerprint: self.fingerprint,
                created: created.clone(),
                at,
            },
        );
        keys.answered.push_back((id, at));
        keys.expire(at);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let mut keys = self.keys.lock();
            if matches!(keys.entries.get(&id), Some(Entry::InFlight(_))) {
                keys.entries.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn created(id: &str) -> SessionCreated {
        SessionCreated {
            session_id: id.into(),
            stream_url: format!("/v1/sessions/{id}/events"),
            created_at: "2026-12-04T00:00:00.000Z".into(),
        }
    }

    fn fresh(claim: Result<Claim, ApiError>) -> Pending {
        match claim {
            Ok(Claim::Fresh(pending)) => pending,
            Ok(Claim::Replay(_)) => panic!("a replay"),
            Err(err) => panic!("refused: {err:?}"),
        }
    }

    fn code(claim: Result<Claim, ApiError>) -> ErrorCode {
        match claim {
            Err(ApiError::Json { code, .. }) => code,
            _ => panic!("not refused"),
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_a_fingerprint_and_values_do() {
        let a = Fingerprint::of("run", Some(&json!({"a": 1, "b": [1, {"c": "x"}]})));
        let b: Value = serde_json::from_str(r#"{ "b": [1, {"c":"x"}], "a": 1 }"#).unwrap();
        assert_eq!(a, Fingerprint::of("run", Some(&b)));
        assert_ne!(
            a,
            Fingerprint::of("run", Some(&json!({"a": 2, "b": [1, {"c": "x"}]})))
        );
        assert_ne!(
            a,
            Fingerprint::of("app:x", Some(&json!({"a": 1, "b": [1, {"c": "x"}]})))
        );
        // A string holding what another value prints as differs from it.
        assert_ne!(
            Fingerprint::of("run", Some(&json!({"a": "1"}))),
            Fingerprint::of("run", Some(&json!({"a": 1})))
        );
    }

    #[tokio::test]
    async fn a_created_key_replays_its_session_and_refuses_another_body() {
        let keys = IdempotencyKeys::default();
        let one = Fingerprint::of("run", Some(&json!({"x": 1})));
        let two = Fingerprint::of("run", Some(&json!({"x": 2})));
        let pending = fresh(keys.claim(Some("t"), "k".into(), one));
        // While the first is decided, a retry is told to wait, another
        // body that the key is taken.
        assert_eq!(
            code(keys.claim(Some("t"), "k".into(), one)),
            ErrorCode::IdempotencyKeyInFlight
        );
        assert_eq!(
            code(keys.claim(Some("t"), "k".into(), two)),
            ErrorCode::IdempotencyKeyReused
        );
        pending.created(&created("s1"));
        match keys.claim(Some("t"), "k".into(), one) {
            Ok(Claim::Replay(replayed)) => assert_eq!(replayed, created("s1")),
            _ => panic!("no replay"),
        }
        assert_eq!(
            code(keys.claim(Some("t"), "k".into(), two)),
            ErrorCode::IdempotencyKeyReused
        );
        // Another token's key of the same name is its own.
        drop(fresh(keys.claim(Some("u"), "k".into(), two)));
        drop(fresh(keys.claim(None, "k".into(), two)));
    }

    #[tokio::test]
    async fn a_refused_request_frees_its_key() {
        let keys = IdempotencyKeys::default();
        let one = Fingerprint::of("run", Some(&json!({"x": 1})));
        drop(fresh(keys.claim(None, "k".into(), one)));
        drop(fresh(keys.claim(None, "k".into(), one)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_answers_for_its_lifetime_and_the_oldest_go_past_the_bound() {
        let keys = IdempotencyKeys::default();
        let one = Fingerprint::of("run", Some(&json!({"x": 1})));
        fresh(keys.claim(None, "old".into(), one)).created(&created("s0"));
        tokio::time::advance(KEY_LIFETIME - Duration::from_secs(1)).await;
        assert!(matches!(
            keys.claim(None, "old".into(), one),
            Ok(Claim::Replay(_))
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(fresh(keys.claim(None, "old".into(), one)));
        for i in 0..=MAX_KEYS {
            fresh(keys.claim(None, format!("k{i}"), one)).created(&created("s"));
        }
        assert!(keys.lock().entries.len() <= MAX_KEYS);
        drop(fresh(keys.claim(None, "k0".into(), one)));
        assert!(matches!(
            keys.claim(None, format!("k{MAX_KEYS}"), one),
            Ok(Claim::Replay(_))
        ));
    }

    #[test]
    fn a_key_is_one_to_255_visible_ascii_characters() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(HEADER, value.parse().unwrap());
            key_of(&headers)
        };
        assert_eq!(with("retry-1").unwrap().as_deref(), Some("retry-1"));
        assert!(with(&"k".repeat(255)).is_ok());
        assert!(with(&"k".repeat(256)).is_err());
        assert!(with("two words").is_err());
        assert!(with("").is_err());
        assert_eq!(key_of(&HeaderMap::new()).unwrap(), None);
    }
}
