//! Outgoing HTTP clients (debug streams, Docker Hub). Every client in the
//! process shares one TLS implementation, rustls on ring, installed here before
//! the first client is built.

pub fn install_tls_provider() {
    // Installing a second time fails harmlessly: the first one stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client builder with the TLS provider in place.
pub fn client_builder() -> reqwest::ClientBuilder {
    install_tls_provider();
    reqwest::Client::builder()
}

/// A default client (panics only if the TLS provider cannot be initialised,
/// which `client_builder` has ruled out).
pub fn client() -> reqwest::Client {
    client_builder()
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}
