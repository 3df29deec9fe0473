//! The Kubernetes client: in-cluster when the runner runs as a pod, else the
//! kubeconfig named by `KUBECONFIG` (or the default one).

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use runner_core::config::{ConfigError, Env, env_string};

pub async fn kube_client(env: &Env) -> Result<Client, ConfigError> {
    let config = if env_string(env, "KUBERNETES_SERVICE_HOST").is_some() {
        Config::incluster().map_err(|err| {
            ConfigError(format!(
                "could not read the in-cluster Kubernetes configuration: {err}"
            ))
        })?
    } else if let Some(path) = env_string(env, "KUBECONFIG") {
        let kubeconfig = Kubeconfig::read_from(&path)
            .map_err(|err| ConfigError(format!("KUBECONFIG '{path}' could not be read: {err}")))?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|err| ConfigError(format!("KUBECONFIG '{path}' is not usable: {err}")))?
    } else {
        Config::infer().await.map_err(|err| {
            ConfigError(format!(
                "no Kubernetes configuration found (not in a cluster, no KUBECONFIG): {err}"
            ))
        })?
    };
    Client::try_from(config)
        .map_err(|err| ConfigError(format!("could not build the Kubernetes client: {err}")))
}
