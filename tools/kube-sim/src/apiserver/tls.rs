//! HTTPS for the simulated apiserver: a CA and a serving certificate made
//! for each simulator, and the accept loop that terminates TLS.
//!
//! TLS is what makes the bearer token usable at all: client-go (kubectl,
//! Helm) only sends a kubeconfig's credentials to an `https://` server, as
//! a real apiserver always is. The CA goes into the kubeconfig
//! (`certificate-authority-data`), so clients verify the simulator as they
//! verify a cluster.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a connection may take to finish its TLS handshake. A local
/// process that connects and says nothing is dropped after this instead of
/// holding a task forever.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// How long open connections (watches, attaches) get to end after shutdown
/// before they are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Pause after a failed `accept` (out of file descriptors, say), so the
/// loop does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("could not generate the simulator's certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("could not configure TLS: {0}")]
    Config(#[from] rustls::Error),
}

/// A simulator's CA and the serving configuration of a certificate it
/// signed for the addresses clients use.
pub struct ServingIdentity {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    server_config: Arc<rustls::ServerConfig>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl ServingIdentity {
    /// A fresh CA and a certificate for `localhost`, `127.0.0.1`, `::1`
    /// and `bound` (the address the simulator listens on).
    pub fn generate(bound: IpAddr) -> Result<Self, TlsError> {
        Self::generate_for(&[bound])
    }

    /// [`Self::generate`] for every address in `bound` (the one clients on
    /// this machine use and the one pods reach, say).
    pub fn generate_for(bound: &[IpAddr]) -> Result<Self, TlsError> {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-sim-ca");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate()?)?;

        let mut names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        for ip in bound {
            if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
                names.push(ip.to_string());
            }
        }
        let mut leaf_params = rcgen::CertificateParams::new(names)?;
        leaf_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = rcgen::KeyPair::generate()?;
        let leaf = leaf_params.signed_by(&leaf_key, &ca)?;

        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let mut server_config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)?;
        // HTTP/1.1 only, as the simulator serves (watches and the attach
        // upgrade are HTTP/1.1 on it).
        server_config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            server_config: Arc::new(server_config),
        })
    }

    /// The CA certificate, PEM, as a kubeconfig's
    /// `certificate-authority-data` holds it (base64 of this).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca_der
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.server_config.clone())
    }

    /// A client configuration that trusts this simulator's CA only.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone())?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Accepts connections until `shutdown`, each served on a task this loop
/// owns: when it returns, every connection has ended or been dropped.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    connections.spawn(serve_connection(
                        tcp,
                        acceptor.clone(),
                        app.clone(),
                        shutdown.clone(),
                    ));
                }
                Err(err) => {
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

async fn serve_connection(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: CancellationToken,
) {
    // Go's net/http, which the apiserver is built on, turns Nagle's
    // algorithm off on every connection; so does the simulator.
    let _ = tcp.set_nodelay(true);
    let tls = match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            tracing::debug!(%err, "TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let service = TowerToHyperService::new(app);
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_verifies_for_loopback_with_its_own_ca() {
        let identity = ServingIdentity::generate(IpAddr::from([127, 0, 0, 1])).expect("generated");
        assert!(identity.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        identity.client_config().expect("a client config");
    }
}
