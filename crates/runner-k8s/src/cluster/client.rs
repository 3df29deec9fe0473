//! The Kubernetes client: in-cluster when the runner runs as a pod, else the
//! kubeconfig named by `KUBECONFIG` (or the default one).

use std::sync::Arc;

use http::{Method, Request, Uri};
use kube::client::{Body, ClientBuilder};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use runner_core::config::{ConfigError, Env, env_string};
use runner_core::metrics::Metrics;
use tower::util::MapRequestLayer;

/// A client whose every request is counted in `metrics` by verb and resource.
/// Why no client to the cluster could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeClientRefusal {
    #[error("KUBECONFIG '{path}' is not usable: {reason}")]
    UnusableKubeconfig { path: String, reason: String },
    #[error("no Kubernetes configuration found (not in a cluster, no KUBECONFIG): {reason}")]
    NoConfiguration { reason: String },
}

pub async fn kube_client(env: &Env, metrics: Arc<Metrics>) -> Result<Client, ConfigError> {
    // Set by Kubernetes in every pod: the host's variable, not a setting.
    let config = if env_string(env, "KUBERNETES_SERVICE_HOST").is_some() {
        Config::incluster().map_err(|err| {
            ConfigError::setup("read the in-cluster Kubernetes configuration", err)
        })?
    } else if let Some(path) = crate::config::KUBECONFIG.string(env) {
        let kubeconfig =
            Kubeconfig::read_from(&path).map_err(|err| ConfigError::UnreadableFile {
                var: crate::config::KUBECONFIG.name.to_owned(),
                path: path.clone(),
                reason: err.to_string(),
            })?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|err| {
                ConfigError::refused(KubeClientRefusal::UnusableKubeconfig {
                    path: path.clone(),
                    reason: err.to_string(),
                })
            })?
    } else {
        Config::infer().await.map_err(|err| {
            ConfigError::refused(KubeClientRefusal::NoConfiguration {
                reason: err.to_string(),
            })
        })?
    };
    let counting = MapRequestLayer::new(move |request: Request<Body>| {
        let (verb, resource) = api_request_labels(request.method(), request.uri());
        metrics.apiserver_request(verb, &resource);
        request
    });
    let builder = ClientBuilder::try_from(config)
        .map_err(|err| ConfigError::setup("build the Kubernetes client", err))?;
    Ok(builder.with_layer(&counting).build())
}

/// The Kubernetes verb and resource (`pods`, `pods/log`) of an apiserver
/// request, from its method and path alone: cheap enough to run per request.
pub fn api_request_labels(method: &Method, uri: &Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        [other, ..] => return (verb_of(method, false, false), (*other).to_owned()),
        [] => return (verb_of(method, false, false), "root".to_owned()),
    };
    let rest = match rest {
        ["namespaces", _namespace, inner @ ..] if !inner.is_empty() => inner,
        other => other,
    };
    let resource = match rest {
        [] => "discovery".to_owned(),
        [resource] | [resource, _] => (*resource).to_owned(),
        [resource, _, subresource, ..] => format!("{resource}/{subresource}"),
    };
    let named = rest.len() >= 2;
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    (verb_of(method, named, watch), resource)
}

fn verb_of(method: &Method, named: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case("GET", "/api/v1/namespaces/s/pods?labelSelector=a", "list", "pods")]
    #[case(
        "GET",
        "/api/v1/namespaces/s/pods?watch=true&resourceVersion=1",
        "watch",
        "pods"
    )]
    #[case("GET", "/api/v1/namespaces/s/pods/p", "get", "pods")]
    #[case("GET", "/api/v1/namespaces/s/pods/p/log", "get", "pods/log")]
    #[case("POST", "/api/v1/namespaces/s/pods", "create", "pods")]
    #[case("DELETE", "/api/v1/namespaces/s/pods/p", "delete", "pods")]
    #[case("GET", "/api/v1/namespaces/s", "get", "namespaces")]
    #[case(
        "PATCH",
        "/apis/networking.k8s.io/v1/namespaces/s/ingresses/i",
        "patch",
        "ingresses"
    )]
    #[case(
        "GET",
        "/apis/gateway.networking.k8s.io/v1/gatewayclasses",
        "list",
        "gatewayclasses"
    )]
    #[case("GET", "/apis/networking.k8s.io/v1", "list", "discovery")]
    #[case("GET", "/version", "list", "version")]
    fn requests_are_labelled_by_verb_and_resource(
        #[case] method: &str,
        #[case] uri: &str,
        #[case] verb: &str,
        #[case] resource: &str,
    ) {
        let method: Method = method.parse().expect("method");
        let uri: Uri = uri.parse().expect("uri");
        assert_eq!(
            api_request_labels(&method, &uri),
            (verb, resource.to_owned())
        );
    }
}
