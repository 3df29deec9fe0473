//! The verifier against a test identity provider on 127.0.0.1: keys made in
//! the test (Ed25519 and P-256 by ring, RSA from a test-only fixture), tokens
//! signed with them, a key set served over HTTP or from a file.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;
use crate::env::env_from_pairs;

const ISSUER: &str = "https://issuer.test/realm";
const AUDIENCE: &str = "telo-runner";
/// Every wait in these tests is on an event, bounded by this.
const WAIT: Duration = Duration::from_secs(20);

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// A signing key of the test issuer and its public JWK.
struct Signer {
    kid: String,
    alg: Algorithm,
    key: EncodingKey,
    jwk: Value,
}

impl Signer {
    fn ed25519(kid: &str) -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("ed25519 pair");
        Self {
            kid: kid.to_owned(),
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({
                "kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": kid,
                "x": b64(pair.public_key().as_ref()),
            }),
        }
    }

    fn p256(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("p-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("p-256 pair");
        // The uncompressed point: 0x04, then x and y.
        let point = pair.public_key().as_ref();
        Self {
            kid: kid.to_owned(),
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({
                "kty": "EC", "crv": "P-256", "kid": kid,
                "x": b64(&point[1..33]), "y": b64(&point[33..65]),
            }),
        }
    }

    /// The test-only RSA key of `tests/fixtures`, for `alg` (RS* or PS*);
    /// `jwk_alg` is what its JWK says, if anything.
    fn rsa(kid: &str, alg: Algorithm, jwk_alg: Option<&str>) -> Self {
        let pem = include_str!("../../tests/fixtures/oidc-test-rsa.pem");
        let body: String = pem
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        let der = STANDARD.decode(body).expect("fixture is base64");
        let pair = RsaKeyPair::from_der(&der).expect("fixture is a PKCS#1 RSA key");
        let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(pair.public());
        let mut jwk = json!({
            "kty": "RSA", "kid": kid, "n": b64(&public.n), "e": b64(&public.e),
        });
        if let Some(jwk_alg) = jwk_alg {
            jwk["alg"] = json!(jwk_alg);
        }
        Self {
            kid: kid.to_owned(),
            alg,
            key: EncodingKey::from_rsa_der(&der),
            jwk,
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key).expect("token signs")
    }
}

fn jwks(signers: &[&Signer]) -> String {
    json!({ "keys": signers.iter().map(|signer| signer.jwk.clone()).collect::<Vec<_>>() })
        .to_string()
}

/// The claims of a good token, with `changes` merged in (`null` removes a
/// claim).
fn claims(changes: Value) -> Value {
    let mut claims = json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "user-1",
        "tenant": "acme",
        "groups": ["dev", "ops"],
        "iat": now(),
        "exp": now() + 300,
    });
    if let (Some(claims), Value::Object(changes)) = (claims.as_object_mut(), changes) {
        for (name, value) in changes {
            if value.is_null() {
                claims.remove(&name);
            } else {
                claims.insert(name, value);
            }
        }
    }
    claims
}

fn config(jwks: JwksSource) -> OidcConfig {
    OidcConfig {
        issuer: ISSUER.to_owned(),
        audience: AUDIENCE.to_owned(),
        jwks,
        tenant_claim: "tenant".to_owned(),
        groups_claim: "groups".to_owned(),
        max_clock_skew: MAX_CLOCK_SKEW,
    }
}

/// What the test provider answers on `/jwks`.
struct Served {
    status: StatusCode,
    body: String,
}

struct ProviderState {
    served: Mutex<Served>,
    hits: AtomicUsize,
}

/// A test identity provider serving a key set on 127.0.0.1.
struct Provider {
    addr: SocketAddr,
    state: Arc<ProviderState>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

async fn serve_jwks(State(state): State<Arc<ProviderState>>) -> impl IntoResponse {
    state.hits.fetch_add(1, Ordering::SeqCst);
    let served = state.served.lock().expect("provider state");
    (
        served.status,
        [("content-type", "application/json")],
        served.body.clone(),
    )
}

impl Provider {
    async fn start(body: String) -> Self {
        let state = Arc::new(ProviderState {
            served: Mutex::new(Served {
                status: StatusCode::OK,
                body,
            }),
            hits: AtomicUsize::new(0),
        });
        let router = axum::Router::new()
            .route("/jwks", axum::routing::get(serve_jwks))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            addr,
            state,
            stop,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/jwks", self.addr)
    }

    fn serve(&self, status: StatusCode, body: String) {
        *self.state.served.lock().expect("provider state") = Served { status, body };
    }

    fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let abort = self.task.abort_handle();
        if tokio::time::timeout(WAIT, self.task).await.is_err() {
            abort.abort();
        }
    }
}

async fn refusal(verifier: &OidcVerifier, token: &str) -> String {
    match verifier.verify(token).await {
        Ok(verified) => panic!("accepted: {verified:?}"),
        Err(refused) => refused.reason,
    }
}

#[tokio::test]
async fn a_good_token_names_its_subject_tenant_and_groups_whatever_its_key() {
    let ed = Signer::ed25519("ed");
    let ec = Signer::p256("ec");
    let rs = Signer::rsa("rs", Algorithm::RS256, Some("RS256"));
    let ps = Signer::rsa("ps", Algorithm::PS384, None);
    let provider = Provider::start(jwks(&[&ed, &ec, &rs, &ps])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");
    for signer in [&ed, &ec, &rs, &ps] {
        let token = signer.sign(&claims(json!({})));
        assert!(OidcVerifier::looks_like_jwt(&token));
        assert_eq!(
            verifier.verify(&token).await,
            Ok(VerifiedToken {
                subject: "user-1".into(),
                tenant: "acme".into(),
                groups: vec!["dev".into(), "ops".into()],
            }),
            "signed with {:?}",
            signer.alg
        );
    }
    // One group as a string, no groups at all, an audience among several.
    let one = verifier
        .verify(&ed.sign(&claims(
            json!({"groups": "admins", "aud": ["other", AUDIENCE]}),
        )))
        .await
        .expect("verifies");
    assert_eq!(one.groups, vec!["admins".to_owned()]);
    let none = verifier
        .verify(&ed.sign(&claims(json!({"groups": null}))))
        .await
        .expect("verifies");
    assert!(none.groups.is_empty());
    // A token without a key id is checked with the keys that fit its alg.
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = None;
    let anonymous = jsonwebtoken::encode(&header, &claims(json!({})), &ed.key).expect("signs");
    assert!(verifier.verify(&anonymous).await.is_ok());
    assert_eq!(provider.hits(), 1, "nothing was fetched again");
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn unsigned_and_shared_secret_tokens_are_refused_by_their_alg() {
    let ed = Signer::ed25519("ed");
    let provider = Provider::start(jwks(&[&ed])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");
    let payload = b64(claims(json!({})).to_string().as_bytes());
    let unsigned = format!(
        "{}.{payload}.",
        b64(json!({"alg": "none", "kid": "ed"}).to_string().as_bytes())
    );
    assert!(OidcVerifier::looks_like_jwt(&unsigned));
    assert_eq!(
        refusal(&verifier, &unsigned).await,
        "the token is signed with alg 'none', which this runner never accepts"
    );
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("ed".into());
    // The key's public bytes as the secret: the classic confusion attack.
    let public = URL_SAFE_NO_PAD
        .decode(ed.jwk["x"].as_str().expect("x"))
        .expect("x is base64url");
    let hmac = jsonwebtoken::encode(
        &header,
        &claims(json!({})),
        &EncodingKey::from_secret(&public),
    )
    .expect("signs");
    assert_eq!(
        refusal(&verifier, &hmac).await,
        "the token is signed with alg 'HS256', a shared-secret algorithm this runner never accepts"
    );
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn issuer_audience_and_the_named_claims_are_checked() {
    let ed = Signer::ed25519("ed");
    let provider = Provider::start(jwks(&[&ed])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");
    for (changes, reason) in [
        (
            json!({"iss": "https://other.test/realm"}),
            "the token's issuer is not 'https://issuer.test/realm'",
        ),
        (
            json!({"iss": null}),
            "the token's issuer is not 'https://issuer.test/realm'",
        ),
        (
            json!({"aud": "someone-else"}),
            "the token's audience is not 'telo-runner'",
        ),
        (
            json!({"aud": ["a", "b"]}),
            "the token's audience is not 'telo-runner'",
        ),
        (
            json!({"tenant": null}),
            "the token has no 'tenant' claim, which names its tenant",
        ),
        (
            json!({"tenant": 7}),
            "the token's 'tenant' claim, which names its tenant, is not a non-empty string",
        ),
        (
            json!({"sub": null}),
            "the token has no 'sub' claim, which names its subject",
        ),
        (
            json!({"groups": ["dev", 1]}),
            "the token's 'groups' claim, which names its groups, is not a string or a list of strings",
        ),
        (
            json!({"exp": null}),
            "the token has no expiry ('exp' claim), which this runner requires",
        ),
        (
            json!({"exp": "tomorrow"}),
            "the token's 'exp' claim is not a number",
        ),
        (
            json!({"nbf": "1700000000"}),
            "the token's 'nbf' claim is not a number",
        ),
    ] {
        let token = ed.sign(&claims(changes.clone()));
        assert_eq!(refusal(&verifier, &token).await, reason, "{changes}");
    }
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn expiry_and_validity_start_are_honoured_with_a_minute_of_skew() {
    let ed = Signer::ed25519("ed");
    let provider = Provider::start(jwks(&[&ed])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");
    // Within the skew either way.
    for changes in [
        json!({"exp": now() - 30}),
        json!({"nbf": now() + 30}),
        json!({"iat": now() + 30}),
    ] {
        let token = ed.sign(&claims(changes.clone()));
        assert!(verifier.verify(&token).await.is_ok(), "{changes}");
    }
    // Beyond it.
    let expired_at = now() - 90;
    let expired = ed.sign(&claims(json!({"exp": expired_at})));
    assert_eq!(
        refusal(&verifier, &expired).await,
        format!(
            "the token expired at {}",
            token::iso_seconds(expired_at as f64)
        )
    );
    let starts_at = now() + 90;
    let early = ed.sign(&claims(json!({"nbf": starts_at})));
    assert_eq!(
        refusal(&verifier, &early).await,
        format!(
            "the token is not valid before {}",
            token::iso_seconds(starts_at as f64)
        )
    );
    let issued_at = now() + 90;
    let future = ed.sign(&claims(json!({"iat": issued_at})));
    assert_eq!(
        refusal(&verifier, &future).await,
        format!(
            "the token was issued in the future, at {}",
            token::iso_seconds(issued_at as f64)
        )
    );
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn tampered_mismatched_and_malformed_tokens_are_refused() {
    let ed = Signer::ed25519("ed");
    let rs = Signer::rsa("rs", Algorithm::RS256, Some("RS256"));
    let provider = Provider::start(jwks(&[&ed, &rs])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");

    // Claims changed under a good signature.
    let token = ed.sign(&claims(json!({})));
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    parts[1] = b64(claims(json!({"sub": "admin"})).to_string().as_bytes());
    assert_eq!(
        refusal(&verifier, &parts.join(".")).await,
        "the token's signature does not verify"
    );
    // A signature that is not one.
    let (signed, _) = token.rsplit_once('.').expect("three parts");
    assert_eq!(
        refusal(&verifier, &format!("{signed}.AAAA")).await,
        "the token's signature does not verify"
    );
    // Signed by another key under the same key id.
    let impostor = Signer::ed25519("ed");
    assert_eq!(
        refusal(&verifier, &impostor.sign(&claims(json!({})))).await,
        "the token's signature does not verify"
    );
    // An alg the named key is not for: RS384 with an RS256 key, ES256 with
    // an Ed25519 key.
    let rs384 = Signer::rsa("rs", Algorithm::RS384, None);
    assert_eq!(
        refusal(&verifier, &rs384.sign(&claims(json!({})))).await,
        "the token is signed with alg 'RS384', which key 'rs' of the issuer's key set is not for"
    );
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("ed".into());
    let es =
        jsonwebtoken::encode(&header, &claims(json!({})), &Signer::p256("x").key).expect("signs");
    assert_eq!(
        refusal(&verifier, &es).await,
        "the token is signed with alg 'ES256', which key 'ed' of the issuer's key set is not for"
    );
    // Not JWTs at all.
    for not_jwt in ["s3cret-static-token", "a.b", "a.b.c.d", "a..c", "a.b=.c"] {
        assert!(!OidcVerifier::looks_like_jwt(not_jwt));
        assert_eq!(refusal(&verifier, not_jwt).await, "the token is not a JWT");
    }
    assert_eq!(
        refusal(&verifier, "e30.bm90IGpzb24.c2ln").await,
        "the token's header names no alg"
    );
    // Well signed, but what it signs is not a claims object.
    let signed = format!(
        "{}.{}",
        b64(br#"{"alg":"EdDSA","kid":"ed"}"#),
        b64(b"not json")
    );
    let signature =
        jsonwebtoken::crypto::sign(signed.as_bytes(), &ed.key, Algorithm::EdDSA).expect("signs");
    assert_eq!(
        refusal(&verifier, &format!("{signed}.{signature}")).await,
        "the token's claims are not a JSON object"
    );
    assert_eq!(
        refusal(
            &verifier,
            &format!("{}.e30.c2ln", "a".repeat(MAX_TOKEN_BYTES))
        )
        .await,
        "the token is larger than 16384 bytes"
    );
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn an_unknown_key_id_is_refetched_at_most_once_per_interval() {
    let ed = Signer::ed25519("k1");
    let provider = Provider::start(jwks(&[&ed])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");
    let stranger = Signer::ed25519("k2");
    let token = stranger.sign(&claims(json!({})));
    assert_eq!(
        refusal(&verifier, &token).await,
        "the token names key id 'k2', which the issuer's key set does not hold"
    );
    assert_eq!(provider.hits(), 2, "the unknown key id was fetched for");
    // Within the interval another unknown key id fetches nothing.
    let other = Signer::ed25519("k3").sign(&claims(json!({})));
    assert_eq!(
        refusal(&verifier, &other).await,
        "the token names key id 'k3', which the issuer's key set does not hold"
    );
    assert_eq!(
        refusal(&verifier, &token).await,
        refusal(&verifier, &token).await
    );
    assert_eq!(provider.hits(), 2, "rate-limited");
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn a_rotated_key_set_is_picked_up_by_the_first_token_of_a_new_key() {
    let old = Signer::ed25519("k1");
    let new = Signer::p256("k2");
    let provider = Provider::start(jwks(&[&old])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");
    let old_token = old.sign(&claims(json!({})));
    assert!(verifier.verify(&old_token).await.is_ok());

    // The issuer rotates: the new key is published, the old one withdrawn.
    provider.serve(StatusCode::OK, jwks(&[&new]));
    let new_token = new.sign(&claims(json!({"sub": "user-2", "tenant": "beta"})));
    assert_eq!(
        verifier.verify(&new_token).await.map(|v| v.tenant),
        Ok("beta".to_owned())
    );
    assert_eq!(provider.hits(), 2);
    // The refetch replaced the set: the withdrawn key no longer verifies,
    // and asking for it again within the interval fetches nothing.
    assert_eq!(
        refusal(&verifier, &old_token).await,
        "the token names key id 'k1', which the issuer's key set does not hold"
    );
    assert_eq!(provider.hits(), 2);
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn the_key_set_is_fetched_again_every_period() {
    let old = Signer::ed25519("k1");
    let provider = Provider::start(jwks(&[&old])).await;
    let timing = Timing {
        period: Duration::from_millis(20),
        min_refetch_interval: REFETCH_MIN_INTERVAL,
    };
    let verifier = OidcVerifier::start_with(config(JwksSource::Url(provider.url())), timing)
        .await
        .expect("starts");
    let old_token = old.sign(&claims(json!({})));
    assert!(verifier.verify(&old_token).await.is_ok());
    // Withdraw the key with nothing else asking, and wait for two periodic
    // refreshes to end (the second began after the change).
    let mut keys = verifier.inner.keys.clone();
    let seen = keys.borrow().finished;
    provider.serve(StatusCode::OK, jwks(&[&Signer::ed25519("k9")]));
    tokio::time::timeout(WAIT, keys.wait_for(|s| s.finished >= seen + 2))
        .await
        .expect("refreshed in time")
        .expect("refresh task alive");
    assert!(!verifier.inner.keys.borrow().keys.holds("k1"));
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn a_failing_refresh_keeps_the_last_good_key_set() {
    let ed = Signer::ed25519("k1");
    let provider = Provider::start(jwks(&[&ed])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");
    let token = ed.sign(&claims(json!({})));
    for (status, body) in [
        (StatusCode::INTERNAL_SERVER_ERROR, "oops".to_owned()),
        (StatusCode::OK, "{\"keys\": []}".to_owned()),
        (StatusCode::OK, "not json".to_owned()),
    ] {
        provider.serve(status, body);
        let hits = provider.hits();
        verifier.refresh().await;
        assert_eq!(
            provider.hits(),
            hits + 1,
            "the refresh reached the provider"
        );
        assert!(verifier.verify(&token).await.is_ok());
    }
    verifier.shutdown().await;
    provider.stop().await;
}

#[tokio::test]
async fn a_key_set_that_cannot_be_fetched_or_used_at_start_is_an_error() {
    // A port nothing listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let url = format!("http://{closed}/jwks");
    match OidcVerifier::start(config(JwksSource::Url(url.clone()))).await {
        Err(OidcError::Unfetchable { url: named, reason }) => {
            assert_eq!(named, url);
            assert!(!reason.is_empty());
        }
        other => panic!("expected an unfetchable key set, got {other:?}"),
    }

    let provider = Provider::start(String::new()).await;
    provider.serve(StatusCode::SERVICE_UNAVAILABLE, String::new());
    let err = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect_err("refused");
    assert_eq!(
        err.to_string(),
        format!(
            "RUNNER_OIDC_JWKS_URL '{}' could not be fetched: it answered HTTP 503",
            provider.url()
        )
    );
    provider.serve(StatusCode::OK, " ".repeat(MAX_JWKS_BYTES + 1));
    let err = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect_err("refused");
    assert_eq!(
        err.to_string(),
        format!(
            "RUNNER_OIDC_JWKS_URL '{}' could not be fetched: it is larger than 1048576 bytes",
            provider.url()
        )
    );
    provider.stop().await;
}

#[tokio::test]
async fn a_key_set_file_is_read_at_start_and_its_errors_name_it() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("jwks.json");
    let ed = Signer::ed25519("k1");
    std::fs::write(&path, jwks(&[&ed])).expect("write");
    let verifier = OidcVerifier::start(config(JwksSource::File(path.clone())))
        .await
        .expect("starts");
    assert!(verifier.verify(&ed.sign(&claims(json!({})))).await.is_ok());
    verifier.shutdown().await;

    let missing = dir.path().join("missing.json");
    let err = OidcVerifier::start(config(JwksSource::File(missing.clone())))
        .await
        .expect_err("refused");
    assert!(
        err.to_string().starts_with(&format!(
            "RUNNER_OIDC_JWKS_FILE '{}' could not be read: ",
            missing.display()
        )),
        "{err}"
    );
    std::fs::write(
        &path,
        "{\"keys\": [{\"kty\": \"oct\", \"k\": \"c2VjcmV0\"}]}",
    )
    .expect("write");
    let err = OidcVerifier::start(config(JwksSource::File(path.clone())))
        .await
        .expect_err("refused");
    assert_eq!(
        err.to_string(),
        format!(
            "RUNNER_OIDC_JWKS_FILE '{}' is not a usable key set: it holds no RSA, P-256, P-384 or Ed25519 signing key",
            path.display()
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_set_file_is_read_again_every_minute() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("jwks.json");
    let old = Signer::ed25519("k1");
    let new = Signer::ed25519("k2");
    std::fs::write(&path, jwks(&[&old])).expect("write");
    let verifier = OidcVerifier::start(config(JwksSource::File(path.clone())))
        .await
        .expect("starts");
    let old_token = old.sign(&claims(json!({})));
    assert!(verifier.verify(&old_token).await.is_ok());
    std::fs::write(&path, jwks(&[&new])).expect("write");
    let started = Instant::now();
    let mut keys = verifier.inner.keys.clone();
    // Paused time runs on to the refresh; the bound is past one period.
    tokio::time::timeout(
        REFRESH_PERIOD + Duration::from_secs(30),
        keys.wait_for(|s| s.finished >= 1),
    )
    .await
    .expect("refreshed within the period")
    .expect("refresh task alive");
    assert!(started.elapsed() >= REFRESH_PERIOD);
    assert!(verifier.verify(&new.sign(&claims(json!({})))).await.is_ok());
    assert_eq!(
        refusal(&verifier, &old_token).await,
        "the token names key id 'k1', which the issuer's key set does not hold"
    );
    verifier.shutdown().await;
}

#[tokio::test]
async fn shutdown_joins_the_refresh_task_and_keeps_the_last_key_set() {
    let ed = Signer::ed25519("k1");
    let provider = Provider::start(jwks(&[&ed])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("starts");
    let clone = verifier.clone();
    verifier.shutdown().await;
    assert!(verifier.inner.keys.has_changed().is_err(), "task stopped");
    // Nothing refreshes any more, and nothing waits for it.
    clone.refresh().await;
    let stranger = Signer::ed25519("k2").sign(&claims(json!({})));
    assert_eq!(
        refusal(&clone, &stranger).await,
        "the token names key id 'k2', which the issuer's key set does not hold"
    );
    assert!(clone.verify(&ed.sign(&claims(json!({})))).await.is_ok());
    assert_eq!(provider.hits(), 1);
    provider.stop().await;
}

fn load(pairs: &[(&str, &str)]) -> Result<Option<OidcConfig>, String> {
    load_oidc_config(&env_from_pairs(pairs)).map_err(|err| err.to_string())
}

#[test]
fn oidc_is_off_without_an_issuer() {
    assert_eq!(load(&[]), Ok(None));
    assert_eq!(load(&[("RUNNER_OIDC_ISSUER", "  ")]), Ok(None));
    // The claims at their defaults change nothing.
    assert_eq!(
        load(&[
            ("RUNNER_OIDC_TENANT_CLAIM", "sub"),
            ("RUNNER_OIDC_GROUPS_CLAIM", "groups")
        ]),
        Ok(None)
    );
}

#[test]
fn the_settings_are_read_with_their_defaults() {
    assert_eq!(
        load(&[
            ("RUNNER_OIDC_ISSUER", " https://issuer.test "),
            ("RUNNER_OIDC_AUDIENCE", "telo-runner"),
            ("RUNNER_OIDC_JWKS_URL", "https://issuer.test/jwks"),
        ]),
        Ok(Some(OidcConfig {
            issuer: "https://issuer.test".into(),
            audience: "telo-runner".into(),
            jwks: JwksSource::Url("https://issuer.test/jwks".into()),
            tenant_claim: "sub".into(),
            groups_claim: "groups".into(),
            max_clock_skew: Duration::from_secs(60),
        }))
    );
    assert_eq!(
        load(&[
            ("RUNNER_OIDC_ISSUER", "https://issuer.test"),
            ("RUNNER_OIDC_AUDIENCE", "telo-runner"),
            ("RUNNER_OIDC_JWKS_FILE", "/etc/runner/jwks.json"),
            ("RUNNER_OIDC_TENANT_CLAIM", "org_id"),
            ("RUNNER_OIDC_GROUPS_CLAIM", "roles"),
        ])
        .map(|config| config.map(|config| (
            config.jwks,
            config.tenant_claim,
            config.groups_claim
        ))),
        Ok(Some((
            JwksSource::File("/etc/runner/jwks.json".into()),
            "org_id".into(),
            "roles".into()
        )))
    );
}

#[test]
fn half_a_configuration_is_refused_with_its_own_message() {
    let issuer = ("RUNNER_OIDC_ISSUER", "https://issuer.test");
    let audience = ("RUNNER_OIDC_AUDIENCE", "telo-runner");
    let url = ("RUNNER_OIDC_JWKS_URL", "https://issuer.test/jwks");
    let file = ("RUNNER_OIDC_JWKS_FILE", "/etc/runner/jwks.json");
    for (pairs, message) in [
        (
            vec![issuer, url],
            "RUNNER_OIDC_AUDIENCE must be set when RUNNER_OIDC_ISSUER is.",
        ),
        (
            vec![issuer, audience],
            "RUNNER_OIDC_JWKS_URL must be set when RUNNER_OIDC_ISSUER is, unless RUNNER_OIDC_JWKS_FILE is.",
        ),
        (
            vec![issuer, audience, url, file],
            "RUNNER_OIDC_JWKS_FILE is set but so is RUNNER_OIDC_JWKS_URL; set exactly one of them.",
        ),
        (
            vec![
                issuer,
                audience,
                ("RUNNER_OIDC_JWKS_URL", "file:///etc/jwks.json"),
            ],
            "RUNNER_OIDC_JWKS_URL must be an http or https URL, got 'file:///etc/jwks.json'.",
        ),
        (
            vec![
                issuer,
                audience,
                ("RUNNER_OIDC_JWKS_URL", "issuer.test/jwks"),
            ],
            "RUNNER_OIDC_JWKS_URL must be an http or https URL, got 'issuer.test/jwks'.",
        ),
        (
            vec![("RUNNER_OIDC_TENANT_CLAIM", "org_id")],
            "RUNNER_OIDC_TENANT_CLAIM is set but RUNNER_OIDC_ISSUER is not; set the issuer to accept OIDC tokens, or unset RUNNER_OIDC_TENANT_CLAIM.",
        ),
        (
            vec![("RUNNER_OIDC_GROUPS_CLAIM", "roles")],
            "RUNNER_OIDC_GROUPS_CLAIM is set but RUNNER_OIDC_ISSUER is not; set the issuer to accept OIDC tokens, or unset RUNNER_OIDC_GROUPS_CLAIM.",
        ),
        (
            vec![audience, url],
            "RUNNER_OIDC_AUDIENCE is set but RUNNER_OIDC_ISSUER is not; set the issuer to accept OIDC tokens, or unset RUNNER_OIDC_AUDIENCE.",
        ),
        (
            vec![file],
            "RUNNER_OIDC_JWKS_FILE is set but RUNNER_OIDC_ISSUER is not; set the issuer to accept OIDC tokens, or unset RUNNER_OIDC_JWKS_FILE.",
        ),
    ] {
        assert_eq!(load(&pairs), Err(message.to_owned()), "{pairs:?}");
    }
}

mod hostile {
    use proptest::prelude::*;

    use super::*;

    /// A key set with one key of each kind, built once.
    fn key_set() -> &'static KeySet {
        static SET: std::sync::OnceLock<KeySet> = std::sync::OnceLock::new();
        SET.get_or_init(|| {
            let signers = [
                Signer::ed25519("ed"),
                Signer::p256("ec"),
                Signer::rsa("rs", Algorithm::RS256, None),
            ];
            KeySet::parse(jwks(&signers.iter().collect::<Vec<_>>()).as_bytes()).expect("key set")
        })
    }

    fn header() -> impl Strategy<Value = String> {
        let alg = prop::sample::select(vec![
            "none", "HS256", "RS256", "RS512", "PS256", "ES256", "ES384", "EdDSA", "ES512", "",
        ]);
        let kid = prop::option::of(prop::sample::select(vec!["ed", "ec", "rs", "zz"]));
        (alg, kid).prop_map(|(alg, kid)| match kid {
            Some(kid) => json!({"alg": alg, "kid": kid}).to_string(),
            None => json!({"alg": alg}).to_string(),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_token_is_refused_or_verified_without_a_panic(
            header in header(),
            payload in prop::collection::vec(any::<u8>(), 0..64),
            signature in prop::collection::vec(any::<u8>(), 0..600),
            raw in ".{0,80}",
        ) {
            let config = config(JwksSource::File("/nonexistent".into()));
            let token = format!("{}.{}.{}", b64(header.as_bytes()), b64(&payload), b64(&signature));
            for token in [token.as_str(), raw.as_str()] {
                if let Ok(parsed) = token::parse(token)
                    && token::check_signature(&parsed, key_set()).is_ok()
                {
                    let _ = token::check_claims(&parsed, &config, 1e9);
                }
            }
        }
    }
}

#[tokio::test]
async fn a_token_checked_once_is_checked_again_only_against_a_new_key_set() {
    let signer = Signer::ed25519("k1");
    let provider = Provider::start(jwks(&[&signer])).await;
    let verifier = OidcVerifier::start(config(JwksSource::Url(provider.url())))
        .await
        .expect("start");
    let token = signer.sign(&claims(json!({})));
    verifier.verify(&token).await.expect("first check");
    verifier.verify(&token).await.expect("remembered");
    // The issuer drops the key: once the new set is read, the remembered
    // signature counts for nothing.
    provider.serve(StatusCode::OK, jwks(&[&Signer::ed25519("k2")]));
    verifier.refresh().await;
    assert!(verifier.verify(&token).await.is_err());
    // Claims are checked every time, remembered signature or not.
    let provider_keys = jwks(&[&signer]);
    provider.serve(StatusCode::OK, provider_keys);
    verifier.refresh().await;
    let expired = signer.sign(&claims(json!({"exp": now() - 3600})));
    assert!(verifier.verify(&expired).await.is_err());
    verifier.shutdown().await;
    provider.stop().await;
}
