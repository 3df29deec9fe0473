//! The library face of kube-sim: start a simulator on an ephemeral port,
//! get a `kube::Client`, seed and read objects, flip controllers and
//! faults, and wait for conditions — without sleeping.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::apiserver::authn::BearerToken;
use crate::apiserver::authz::{Authorizer, Denial};
use crate::apiserver::tls::ServingIdentity;
use crate::apiserver::watch::DEFAULT_BOOKMARK_INTERVAL;
use crate::apiserver::{ApiContext, router};
use crate::controllers::{self, Switch};
use crate::errors::ApiError;
use crate::events::EventRecorder;
use crate::faults::Faults;
use crate::kinds::{self, ResourceId};
use crate::kubelet::engine::{Engine, Runtime};
use crate::kubelet::images::{ImageBehaviour, ImageTable};
use crate::kubelet::podnet::{self, Bridge, Decision, PodNetwork};
use crate::kubelet::{DEFAULT_ATTACH_DELAY, DEFAULT_PULL_DELAY, Kubelet, KubeletConfig, Latency};
use crate::stats::{Stats, StatsCollector};
use crate::storage::registry::{self, Registry};
use crate::storage::store::{DEFAULT_HISTORY_PER_KIND, Store};

/// Namespaces every simulator starts with: a new cluster's, nothing more, so
/// an installer (Helm, the chart) finds what it would find on a real one.
/// Whoever needs more creates them, as on a cluster ([`KubeSimBuilder::namespace`]).
pub const DEFAULT_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("could not bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("could not create the simulator's sandbox directory: {0}")]
    Sandbox(#[source] std::io::Error),
    #[error("invalid image rule: {0}")]
    Image(String),
    #[error("the docker runtime needs a container engine: {0}")]
    Engine(String),
    #[error(transparent)]
    Network(#[from] crate::kubelet::podnet::NetworkError),
    #[error(transparent)]
    Tls(#[from] crate::apiserver::tls::TlsError),
}

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    #[error("could not decode {0}: {1}")]
    Decode(String, #[source] serde_json::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("the object has no known apiVersion/kind")]
    UnknownKind,
    #[error("could not encode the object: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the apiserver refused the object: {0}")]
    Refused(#[source] ApiError),
}

pub struct KubeSimBuilder {
    listen: SocketAddr,
    gateway_api: bool,
    ingress_controller: bool,
    gateway_controller: bool,
    images: ImageTable,
    image_errors: Vec<String>,
    fake_telo: Option<PathBuf>,
    namespaces: Vec<String>,
    history_per_kind: usize,
    bookmark_interval: Duration,
    pull_delay: Duration,
    latency: Latency,
    attach_delay: Duration,
    ingress_classes: Vec<(String, bool)>,
    runtime: Runtime,
    container_engine: Option<PathBuf>,
    pod_network: PodNetwork,
}

impl Default for KubeSimBuilder {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            gateway_api: false,
            ingress_controller: true,
            gateway_controller: true,
            images: ImageTable::with_defaults(),
            image_errors: Vec::new(),
            fake_telo: None,
            namespaces: DEFAULT_NAMESPACES.iter().map(|s| s.to_string()).collect(),
            history_per_kind: DEFAULT_HISTORY_PER_KIND,
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            pull_delay: DEFAULT_PULL_DELAY,
            latency: Latency::default(),
            attach_delay: DEFAULT_ATTACH_DELAY,
            ingress_classes: Vec::new(),
            runtime: Runtime::Process,
            container_engine: None,
            pod_network: PodNetwork::Auto,
        }
    }
}

impl KubeSimBuilder {
    /// Address to bind (default `127.0.0.1:0`).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Serve `gateway.networking.k8s.io` (v1 and v1beta1).
    pub fn gateway_api(mut self, on: bool) -> Self {
        self.gateway_api = on;
        self
    }

    pub fn ingress_controller(mut self, on: bool) -> Self {
        self.ingress_controller = on;
        self
    }

    pub fn gateway_controller(mut self, on: bool) -> Self {
        self.gateway_controller = on;
        self
    }

    /// Maps images matching `glob` to a behaviour (before the defaults).
    pub fn image(mut self, glob: &str, behaviour: ImageBehaviour) -> Self {
        if let Err(e) = self.images.add(glob, behaviour) {
            self.image_errors.push(e);
        }
        self
    }

    /// Declares that the registry holds the images matching `glob`. Once
    /// any is declared, every other image fails to pull as a registry
    /// without it does (`ErrImagePull` "not found", then
    /// `ImagePullBackOff`), whatever [`Self::image`] says it would run as.
    /// Without any, every image the image table knows exists.
    pub fn published_image(mut self, glob: &str) -> Self {
        if let Err(e) = self.images.publish(glob) {
            self.image_errors.push(e);
        }
        self
    }

    /// The `fake-telo` binary (default: next to this executable or on PATH).
    pub fn fake_telo(mut self, path: impl Into<PathBuf>) -> Self {
        self.fake_telo = Some(path.into());
        self
    }

    /// An extra namespace to create at start.
    pub fn namespace(mut self, name: &str) -> Self {
        self.namespaces.push(name.to_string());
        self
    }

    /// Watch-cache depth per kind; older resourceVersions get 410 Expired.
    pub fn history_per_kind(mut self, events: usize) -> Self {
        self.history_per_kind = events;
        self
    }

    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    pub fn pull_delay(mut self, delay: Duration) -> Self {
        self.pull_delay = delay;
        self
    }

    /// How long scheduling, a pod's sandbox and each container start take
    /// ([`Latency::CLUSTER`] is a published-figures profile).
    pub fn latency(mut self, latency: Latency) -> Self {
        self.latency = latency;
        self
    }

    /// The longest an attach waits, after its upgrade was answered, before
    /// it carries the container's output (each waits a random part of it):
    /// a real apiserver answers the upgrade first and dials the kubelet
    /// after, so output written meanwhile reaches the container log only.
    pub fn attach_delay(mut self, longest: Duration) -> Self {
        self.attach_delay = longest;
        self
    }

    /// How containers run: local processes (the default) or real
    /// containers of a docker engine ([`Runtime::Docker`]).
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = runtime;
        self
    }

    /// The docker client of [`Runtime::Docker`] (default: the
    /// `TELO_RUNNER_CONTAINER_ENGINE` environment variable, else `docker`
    /// on `PATH`).
    pub fn container_engine(mut self, client: impl Into<PathBuf>) -> Self {
        self.container_engine = Some(client.into());
        self
    }

    /// Which network pods get: their own namespace and address on a
    /// bridge of this simulator ([`PodNetwork::Isolated`]; in the docker
    /// runtime, the namespace of an infra container per pod), the host's
    /// ([`PodNetwork::Host`]), or isolated where the machine allows it
    /// ([`PodNetwork::Auto`], the default).
    pub fn pod_network(mut self, network: PodNetwork) -> Self {
        self.pod_network = network;
        self
    }

    /// Creates an IngressClass handled by the simulated controller.
    pub fn ingress_class(mut self, name: &str, default: bool) -> Self {
        self.ingress_classes.push((name.to_string(), default));
        self
    }

    pub async fn start(self) -> Result<KubeSim, StartError> {
        if let Some(e) = self.image_errors.first() {
            return Err(StartError::Image(e.clone()));
        }
        let listener = tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|source| StartError::Bind {
                addr: self.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: self.listen,
            source,
        })?;
        let root = tempfile::Builder::new()
            .prefix("kube-sim-")
            .tempdir()
            .map_err(StartError::Sandbox)?;
        let shutdown = CancellationToken::new();
        let store = Arc::new(Store::new(self.history_per_kind));
        let registry = Arc::new(Registry::new(store.clone()));
        let ns_refs: Vec<&str> = self.namespaces.iter().map(String::as_str).collect();
        registry::bootstrap(&registry, &ns_refs);
        for (name, default) in &self.ingress_classes {
            let mut class = json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
                "metadata": {"name": name}, "spec": {"controller": controllers::ingress::CONTROLLER_NAME}});
            if *default {
                class["metadata"]["annotations"] =
                    json!({"ingressclass.kubernetes.io/is-default-class": "true"});
            }
            let _ = registry.create(kinds::id("ingressclasses"), "", class, false);
        }
        let recorder = Arc::new(EventRecorder::new(registry.clone()));
        let engine = match self.runtime {
            Runtime::Process => None,
            Runtime::Docker => Some(
                Engine::connect(self.container_engine.as_deref(), shutdown.clone())
                    .await
                    .map_err(StartError::Engine)?,
            ),
        };
        if let Some(engine) = &engine {
            // The node reports the runtime its pods run in.
            registry.mutate(
                kinds::id("nodes"),
                "",
                crate::storage::defaults::NODE_NAME,
                |n| {
                    *crate::meta::path_mut(n, "status.nodeInfo.containerRuntimeVersion") =
                        json!(format!("docker://{}", engine.server_version()));
                    true
                },
            );
        }
        let network = start_network(self.pod_network, engine.as_deref()).await?;
        // Pods of an isolated network reach the apiserver at the node's
        // address, as in-cluster clients reach the `kubernetes` Service:
        // the same server listens there too.
        let pod_listener = match &network {
            Some(bridge) if !addr.ip().is_unspecified() => {
                let gateway = std::net::IpAddr::V4(bridge.gateway());
                let bound = match tokio::net::TcpListener::bind((gateway, addr.port())).await {
                    Ok(l) => Ok(l),
                    Err(_) => tokio::net::TcpListener::bind((gateway, 0)).await,
                };
                Some(bound.map_err(|source| StartError::Bind {
                    addr: SocketAddr::new(gateway, addr.port()),
                    source,
                })?)
            }
            _ => None,
        };
        let pod_api_addr = match &pod_listener {
            Some(l) => l
                .local_addr()
                .map_err(|source| StartError::Bind { addr, source })?,
            None => addr,
        };
        let identity = Arc::new(ServingIdentity::generate_for(&[
            addr.ip(),
            pod_api_addr.ip(),
        ])?);
        let token = BearerToken::random();
        if let Some(bridge) = &network {
            // The node's address is where its pods reach it.
            let ip = bridge.gateway().to_string();
            registry.mutate(
                kinds::id("nodes"),
                "",
                crate::storage::defaults::NODE_NAME,
                |n| {
                    *crate::meta::path_mut(n, "status.addresses") = json!([
                        {"type": "InternalIP", "address": ip},
                        {"type": "Hostname", "address": crate::storage::defaults::NODE_NAME},
                    ]);
                    *crate::meta::path_mut(n, "spec.podCIDR") = json!(bridge.subnet());
                    *crate::meta::path_mut(n, "spec.podCIDRs") = json!([bridge.subnet()]);
                    true
                },
            );
        }
        let fake_telo = self.fake_telo.or_else(find_fake_telo);
        let kubelet = Kubelet::new(
            registry.clone(),
            recorder,
            KubeletConfig {
                images: self.images,
                fake_telo,
                root: root.path().to_path_buf(),
                pull_delay: self.pull_delay,
                latency: self.latency,
                engine,
                network,
                api: Some(crate::kubelet::PodApiAccess {
                    server: format!("https://{pod_api_addr}"),
                    ca_pem: identity.ca_pem().to_owned(),
                    token: token.as_str().to_owned(),
                }),
            },
            shutdown.clone(),
        )
        .map_err(StartError::Sandbox)?;
        let ctx = Arc::new(ApiContext {
            registry: registry.clone(),
            store: store.clone(),
            faults: Arc::new(Faults::default()),
            stats: Arc::new(StatsCollector::default()),
            authz: Arc::new(Authorizer::default()),
            kubelet: kubelet.clone(),
            gateway_api: self.gateway_api,
            server_address: addr.to_string(),
            bookmark_interval: self.bookmark_interval,
            attach_delay: self.attach_delay,
            token,
            shutdown: shutdown.clone(),
        });
        let ingress = Switch::new(self.ingress_controller);
        let gateway = Switch::new(self.gateway_controller);
        let mut tasks = vec![
            tokio::spawn(kubelet.clone().run()),
            tokio::spawn(
                controllers::gc::GarbageCollector::new(registry.clone()).run(shutdown.clone()),
            ),
            tokio::spawn(controllers::namespace::run(
                registry.clone(),
                shutdown.clone(),
            )),
            tokio::spawn(controllers::ingress::run(
                registry.clone(),
                ingress.clone(),
                shutdown.clone(),
            )),
            tokio::spawn(controllers::workloads::run(
                registry.clone(),
                shutdown.clone(),
            )),
        ];
        if self.gateway_api {
            tasks.push(tokio::spawn(controllers::gateway::run(
                registry.clone(),
                gateway.clone(),
                shutdown.clone(),
            )));
        }
        let app = router(ctx.clone());
        if let Some(pod_listener) = pod_listener {
            tasks.push(tokio::spawn(crate::apiserver::tls::serve(
                pod_listener,
                identity.acceptor(),
                app.clone(),
                shutdown.clone(),
            )));
        }
        tasks.push(tokio::spawn(crate::apiserver::tls::serve(
            listener,
            identity.acceptor(),
            app,
            shutdown.clone(),
        )));
        Ok(KubeSim {
            addr,
            identity,
            ctx,
            registry,
            kubelet,
            ingress,
            gateway,
            shutdown,
            tasks,
            root,
        })
    }
}

/// The pod network as `requested` and the machine allow: the bridge, or
/// `None` for the host network (saying why when isolated pods were
/// possible to ask for but are not). The docker runtime's pods (`engine`)
/// need more of the machine: naming their infra containers' namespaces,
/// and an engine whose containers are processes of this machine.
async fn start_network(
    requested: PodNetwork,
    engine: Option<&Engine>,
) -> Result<Option<Arc<Bridge>>, StartError> {
    let probed = match requested {
        PodNetwork::Host => Err(String::new()),
        _ => match (podnet::probe(), engine) {
            (Ok(tools), Some(engine)) => match podnet::probe_attach(&tools) {
                Ok(()) => engine.probe_infra().await.map(|()| tools),
                Err(e) => Err(e),
            },
            (probed, _) => probed,
        },
    };
    let (tools, available) = match probed {
        Ok(tools) => (Some(tools), Ok(())),
        Err(why) => (None, Err(why)),
    };
    match (podnet::decide(requested, available)?, tools) {
        (Decision::Isolated, Some(tools)) => Ok(Some(Arc::new(Bridge::create(tools)?))),
        (Decision::Fallback(why), _) => {
            tracing::warn!(
                "pods run on the host network (127.0.0.0/8 addresses, shared ports): {why}; \
                 --pod-network host says so explicitly"
            );
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// `fake-telo` next to the running executable (or its parent directory, for
/// test binaries in `target/<profile>/deps`), else on `PATH`.
pub fn find_fake_telo() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(dir) = exe.parent() {
        dirs.push(dir.to_path_buf());
        if let Some(parent) = dir.parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter()
        .map(|d| d.join("fake-telo"))
        .find(|p| p.is_file())
}

/// A running simulator. Dropping it stops the server and kills every
/// container process it started (and has every container it started in
/// the docker runtime removed).
pub struct KubeSim {
    addr: SocketAddr,
    identity: Arc<ServingIdentity>,
    ctx: Arc<ApiContext>,
    registry: Arc<Registry>,
    kubelet: Arc<Kubelet>,
    ingress: Arc<Switch>,
    gateway: Arc<Switch>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    root: tempfile::TempDir,
}

impl KubeSim {
    pub fn builder() -> KubeSimBuilder {
        KubeSimBuilder::default()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The node's address as its pods reach it: the pods' gateway with an
    /// isolated pod network, else `127.0.0.1`. A service pods must reach
    /// (the runner, for its bundles) listens there.
    pub fn node_ip(&self) -> std::net::Ipv4Addr {
        self.kubelet.node_ip()
    }

    /// The bridge of an isolated pod network (its name, subnet, gateway).
    pub fn pod_bridge(&self) -> Option<&Arc<Bridge>> {
        self.kubelet.network()
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The CA that signed the simulator's serving certificate (PEM); the
    /// kubeconfig carries it.
    pub fn ca_pem(&self) -> &str {
        self.identity.ca_pem()
    }

    /// A rustls client configuration that trusts this simulator, for raw
    /// TLS clients (a WebSocket attach, say).
    pub fn tls_client_config(&self) -> Arc<rustls::ClientConfig> {
        self.identity
            .client_config()
            .unwrap_or_else(|e| panic!("TLS client config for kube-sim: {e}"))
    }

    /// A TLS connection to the simulator, verified against its CA, for
    /// clients that speak HTTP themselves.
    pub async fn connect_tls(
        &self,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        let name = rustls::pki_types::ServerName::IpAddress(self.addr.ip().into());
        tokio_rustls::TlsConnector::from(self.tls_client_config())
            .connect(name, tcp)
            .await
    }

    /// A reqwest client that trusts the simulator and sends no credential.
    pub fn anonymous_http_client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_backend_preconfigured((*self.tls_client_config()).clone())
            .build()
            .unwrap_or_else(|e| panic!("HTTP client for kube-sim: {e}"))
    }

    /// A reqwest client that trusts the simulator and sends its token.
    pub fn http_client(&self) -> reqwest::Client {
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = http::HeaderValue::from_str(&self.authorization()) {
            headers.insert(http::header::AUTHORIZATION, value);
        }
        reqwest::Client::builder()
            .tls_backend_preconfigured((*self.tls_client_config()).clone())
            .default_headers(headers)
            .build()
            .unwrap_or_else(|e| panic!("HTTP client for kube-sim: {e}"))
    }

    /// The bearer token every request to this simulator must carry (the
    /// one its kubeconfig holds); for raw HTTP clients.
    pub fn token(&self) -> &str {
        self.ctx.token.as_str()
    }

    /// `Bearer <token>`, an `Authorization` header value.
    pub fn authorization(&self) -> String {
        format!("Bearer {}", self.token())
    }

    /// A kube-rs client for this simulator (default namespace `default`),
    /// with its token.
    pub fn client(&self) -> kube::Client {
        self.client_via(self.addr)
    }

    /// Like [`KubeSim::client`], connecting to `addr` instead: a relay in
    /// front of the simulator on its address (its certificate names the
    /// IP, not the port), which a test can cut to partition one client.
    pub fn client_via(&self, addr: SocketAddr) -> kube::Client {
        let uri: http::Uri = format!("https://{addr}")
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1"));
        let mut config = kube::Config::new(uri);
        config.root_cert = Some(vec![self.identity.ca_der().to_vec()]);
        config.auth_info.token = Some(self.token().to_owned().into());
        kube::Client::try_from(config).unwrap_or_else(|e| panic!("kube client for kube-sim: {e}"))
    }

    pub fn kubeconfig_yaml(&self) -> String {
        crate::kubeconfig::render(&self.url(), "default", self.ca_pem(), self.token())
    }

    /// Writes this simulator's kubeconfig, its token included, readable by
    /// its owner only.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        crate::kubeconfig::write(path, &self.url(), "default", self.ca_pem(), self.token())
    }

    /// A kubeconfig like [`KubeSim::write_kubeconfig`]'s that connects to
    /// `addr` (a relay in front of the simulator, see
    /// [`KubeSim::client_via`]).
    pub fn write_kubeconfig_via(&self, path: &Path, addr: SocketAddr) -> std::io::Result<()> {
        crate::kubeconfig::write(
            path,
            &format!("https://{addr}"),
            "default",
            self.ca_pem(),
            self.token(),
        )
    }

    /// How this simulator runs containers.
    pub fn runtime(&self) -> Runtime {
        if self.kubelet.engine().is_some() {
            Runtime::Docker
        } else {
            Runtime::Process
        }
    }

    /// `kube-sim.instance=<id>`, the label every container of this
    /// simulator carries in the docker runtime (`docker ps --filter
    /// label=…`); `None` in the process runtime.
    pub fn container_label(&self) -> Option<String> {
        self.kubelet.engine().map(|e| e.label())
    }

    /// The simulator's sandbox directory (pod volumes live under it).
    pub fn sandbox_dir(&self) -> &Path {
        self.root.path()
    }

    /// Creates an object as an admin would (no RBAC denials, no faults).
    pub fn seed<K: Serialize + DeserializeOwned>(&self, obj: &K) -> Result<K, SeedError> {
        let value = serde_json::to_value(obj).map_err(SeedError::Encode)?;
        let created = self.seed_value(value)?;
        serde_json::from_value(created).map_err(SeedError::Encode)
    }

    /// [`KubeSim::seed`] for a JSON object.
    pub fn seed_value(&self, value: Value) -> Result<Value, SeedError> {
        let api_version = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        let res = kinds::find_kind(api_version, kind).ok_or(SeedError::UnknownKind)?;
        let ns = crate::meta::namespace(&value).to_string();
        let ns = if res.info().namespaced && ns.is_empty() {
            "default".to_string()
        } else {
            ns
        };
        let created = self
            .registry
            .create(res, &ns, value, false)
            .map_err(SeedError::Refused)?;
        Ok(created.value.clone())
    }

    fn res_of<K: kube::Resource<DynamicType = ()>>() -> Option<ResourceId> {
        kinds::find(&K::group(&()), &K::plural(&()))
    }

    /// Reads an object straight from the store (`ns` "" for cluster-scoped).
    pub fn get<K>(&self, ns: &str, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let res = Self::res_of::<K>()?;
        let obj = self.ctx.store.get(res, ns, name)?;
        let mut v = obj.value.clone();
        v["apiVersion"] = json!(K::api_version(&()));
        serde_json::from_value(v).ok()
    }

    /// Reads any object as JSON by plural (`"httproutes"`).
    pub fn get_value(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let res = kinds::id(plural);
        if res.0 >= kinds::RESOURCES.len() {
            return None;
        }
        self.ctx.store.get(res, ns, name).map(|o| o.value.clone())
    }

    pub fn faults(&self) -> &Faults {
        &self.ctx.faults
    }

    /// Makes matching requests fail with the apiserver's RBAC 403.
    pub fn deny(&self, denial: Denial) {
        self.ctx.authz.deny(denial);
    }

    pub fn clear_denials(&self) {
        self.ctx.authz.clear();
    }

    pub fn set_ingress_controller(&self, on: bool) {
        self.ingress.set(on);
    }

    pub fn set_gateway_controller(&self, on: bool) {
        self.gateway.set(on);
    }

    pub fn stats(&self) -> Stats {
        let mut s = self.ctx.stats.snapshot();
        s.processes = self.kubelet.process_count();
        s.pods = self.ctx.store.read(|t| t.count(kinds::pods()));
        s
    }

    /// When each pod was created, scheduled, running, finished and deleted.
    pub fn pod_timeline(&self) -> Vec<crate::PodTimeline> {
        self.ctx.store.pod_timeline()
    }

    /// Waits until the object exists and `cond` holds, on store changes.
    pub async fn wait_for<K>(
        &self,
        ns: &str,
        name: &str,
        cond: impl Fn(&K) -> bool,
        timeout: Duration,
    ) -> Result<K, WaitError>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let what = format!("{} {ns}/{name}", K::kind(&()));
        let Some(res) = Self::res_of::<K>() else {
            return Err(WaitError::Timeout(timeout, what));
        };
        let mut changes = self.ctx.store.subscribe(res);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(obj) = self.get::<K>(ns, name)
                && cond(&obj)
            {
                return Ok(obj);
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return Err(WaitError::Timeout(timeout, what)) },
                _ = tokio::time::sleep_until(deadline) => return Err(WaitError::Timeout(timeout, what)),
            }
        }
    }

    /// [`KubeSim::wait_for`] on the stored JSON, for objects that need not
    /// read as their Kubernetes type.
    pub async fn wait_for_value(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
        cond: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Result<Value, WaitError> {
        let res = kinds::id(plural);
        let what = format!("{plural} {ns}/{name}");
        let mut changes = self.ctx.store.subscribe(res);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(obj) = self.ctx.store.get(res, ns, name)
                && cond(&obj.value)
            {
                return Ok(obj.value.clone());
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return Err(WaitError::Timeout(timeout, what)) },
                _ = tokio::time::sleep_until(deadline) => return Err(WaitError::Timeout(timeout, what)),
            }
        }
    }

    /// Waits until the object is gone.
    pub async fn wait_for_deletion(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(), WaitError> {
        let res = kinds::id(plural);
        let what = format!("{plural} {ns}/{name} to be deleted");
        let mut changes = self.ctx.store.subscribe(res);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.ctx.store.get(res, ns, name).is_none() {
                return Ok(());
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return Err(WaitError::Timeout(timeout, what)) },
                _ = tokio::time::sleep_until(deadline) => return Err(WaitError::Timeout(timeout, what)),
            }
        }
    }

    /// Stops the server and kills every process, waiting for the tasks;
    /// in the docker runtime, every container this simulator started is
    /// removed before it returns.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        self.kubelet.kill_all();
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        self.kubelet.close_engine().await;
        self.kubelet.close_network();
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.kubelet.kill_all();
        for t in &self.tasks {
            t.abort();
        }
        // Containers are removed in the background (already done after
        // `shutdown`).
        self.kubelet.close_engine_now();
        // The network's guardian removes the bridge and the pods' veths
        // and namespaces (already done after `shutdown`).
        self.kubelet.close_network_now();
    }
}
