//! Per-session routing: each session's tcp ports published at
//! `<port>-<sessionId>.<baseDomain>` through the layer resolved at boot
//! (Ingress or Gateway API), and the truth about whether each route works.
//!
//! Builders ([`service`], [`ingress`], [`gateway`]) and the layer decision
//! ([`mode`]) are pure; [`SessionRouter`] is the thin I/O around them: it
//! publishes a session's objects and follows their status through one shared
//! watch ([`informer`]) that [`health`] turns into `route` events.

pub mod create_or_replace;
pub mod detect;
pub mod endpoints;
pub mod gateway;
pub mod health;
pub mod informer;
pub mod ingress;
pub mod live;
pub mod meta;
pub mod mode;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::DeleteParams;
use kube::core::{ApiResource, DynamicObject};
use kube::{Api, Client};
use runner_core::SessionSink;
use runner_core::tasks::OwnedTasks;
use runner_core::types::{PortMapping, RouteState};
use tracing::warn;

use crate::cluster::api_error::{api_reason, is_not_found};
use crate::config::{GatewayParent, K8sConfig};
use create_or_replace::{create_or_replace, nothing_allocated};
use endpoints::{host_for, tcp_ports};
use gateway::{build_http_route, http_route_resource, http_route_verdict, route_name};
use health::{PublishedRoute, RouteHealth, RouteReport, Verdict};
use informer::{RouteInformer, RouteSubscription};
use ingress::{IngressSettings, build_session_ingress, ingress_name, ingress_verdict};
use meta::{SessionObjects, pod_owner_reference};
use mode::ResolvedRouting;
use service::{build_session_service, keep_allocated_fields};

/// The layer session routes are published on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingLayer {
    Ingress(IngressSettings),
    Gateway {
        api_version: String,
        parent: GatewayParent,
    },
}

/// Publishing a session's routing objects failed. The client sees
/// [`PublishError::api_reason`]; the log gets the whole chain.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("could not publish the session Service")]
    Service(#[source] kube::Error),
    #[error("could not publish the session Ingress")]
    Ingress(#[source] kube::Error),
    #[error("could not publish the session HTTPRoute of port {port}")]
    HttpRoute {
        port: u16,
        #[source]
        source: kube::Error,
    },
    #[error("could not delete a session route no longer declared")]
    DeleteStale(#[source] kube::Error),
}

impl PublishError {
    fn kube_error(&self) -> &kube::Error {
        match self {
            Self::Service(err) | Self::Ingress(err) | Self::DeleteStale(err) => err,
            Self::HttpRoute { source, .. } => source,
        }
    }

    /// Client-safe: what was refused and who can act, never the Status text.
    pub fn api_reason(&self) -> String {
        api_reason(self.kube_error())
    }
}

/// Publishes sessions' routes on the resolved layer and follows their health.
pub struct SessionRouter {
    client: Client,
    namespace: String,
    managed_by: String,
    base_domain: String,
    layer: RoutingLayer,
    ready_timeout: Duration,
    informer: Arc<RouteInformer>,
    /// The backend's task owner: each session's route following runs there.
    tasks: OwnedTasks,
}

impl SessionRouter {
    /// The router of a routed runner, with its shared route informer running
    /// until `tasks` shut down; `None` for a logs-only runner.
    pub fn spawn(
        client: Client,
        config: &K8sConfig,
        resolved: ResolvedRouting,
        watch_restarts: runner_core::metrics::Counter,
        tasks: &OwnedTasks,
    ) -> Option<Arc<Self>> {
        let base_domain = config.routing.base_domain.clone()?;
        let (layer, resource) = match resolved {
            ResolvedRouting::None { .. } => return None,
            ResolvedRouting::Ingress { class } => (
                RoutingLayer::Ingress(IngressSettings {
                    class,
                    tls_secret: config.routing.tls_secret_name.clone(),
                    annotations: config.routing.ingress_annotations.clone(),
                }),
                ApiResource::erase::<Ingress>(&()),
            ),
            ResolvedRouting::Gateway {
                api_version,
                parent,
            } => {
                let resource = http_route_resource(&api_version);
                (
                    RoutingLayer::Gateway {
                        api_version,
                        parent,
                    },
                    resource,
                )
            }
        };
        let namespace = config.session_namespace.clone();
        let api = Api::namespaced_with(client.clone(), &namespace, &resource);
        let (informer, task) = RouteInformer::spawn(
            api,
            resource,
            &config.managed_by,
            watch_restarts,
            tasks.stopping(),
        );
        tasks.adopt(task);
        let router = Arc::new(Self {
            client,
            namespace,
            managed_by: config.managed_by.clone(),
            base_domain,
            layer,
            ready_timeout: config.routing.route_ready_timeout,
            informer,
            tasks: tasks.clone(),
        });
        Some(router)
    }

    /// Why the route informer cannot be relied on now (`/readyz`), if it cannot.
    pub fn not_ready_reason(&self) -> Option<String> {
        self.informer.not_ready_reason()
    }

    pub fn base_domain(&self) -> &str {
        &self.base_domain
    }

    /// Publish the Service and routes of a session whose pod is `pod_name`
    /// (uid `pod_uid`), before its `running` status announces the URLs. A
    /// failure is returned for reporting, never to fail the session.
    pub async fn publish_session(
        self: &Arc<Self>,
        session_id: &str,
        ports: &[PortMapping],
        pod_name: &str,
        pod_uid: &str,
    ) -> SessionRoutes {
        let subscription = self.informer.subscribe(session_id);
        let objects = SessionObjects {
            namespace: self.namespace.clone(),
            managed_by: self.managed_by.clone(),
            session_id: session_id.to_owned(),
            owner: pod_owner_reference(pod_name, pod_uid),
        };
        let outcome = self.publish(&objects, ports, &subscription).await;
        let outcome = match outcome {
            Ok(routes) => Ok(routes),
            Err(err) => {
                warn!(session_id, error = %err, cause = ?err.kube_error(), "could not publish the session routes");
                Err(err.api_reason())
            }
        };
        SessionRoutes {
            router: self.clone(),
            hosts: tcp_ports(ports)
                .into_iter()
                .map(|port| (host_for(&self.base_domain, session_id, port), port))
                .collect(),
            outcome,
            subscription,
        }
    }

    async fn publish(
        &self,
        objects: &SessionObjects,
        ports: &[PortMapping],
        subscription: &RouteSubscription,
    ) -> Result<Vec<PublishedRoute>, PublishError> {
        if ports.is_empty() {
            return Ok(Vec::new());
        }
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        create_or_replace(
            &services,
            &build_session_service(objects, ports),
            keep_allocated_fields,
        )
        .await
        .map_err(PublishError::Service)?;
        let tcp = tcp_ports(ports);
        // Objects the shared informer knows this session had: only a republish
        // (an adoption) can find any, and those no longer declared go.
        let known: Vec<String> = subscription.objects.borrow().keys().cloned().collect();
        let session_id = &objects.session_id;
        match &self.layer {
            RoutingLayer::Ingress(settings) => {
                let api: Api<Ingress> = Api::namespaced(self.client.clone(), &self.namespace);
                let name = ingress_name(session_id);
                let Some(ingress) =
                    build_session_ingress(objects, settings, &self.base_domain, &tcp)
                else {
                    if known.contains(&name) {
                        delete_ignoring_absent(&api, &name)
                            .await
                            .map_err(PublishError::DeleteStale)?;
                    }
                    return Ok(Vec::new());
                };
                create_or_replace(&api, &ingress, nothing_allocated)
                    .await
                    .map_err(PublishError::Ingress)?;
                Ok(self.routes(session_id, &tcp, |_| name.clone()))
            }
            RoutingLayer::Gateway {
                api_version,
                parent,
            } => {
                let api: Api<DynamicObject> = Api::namespaced_with(
                    self.client.clone(),
                    &self.namespace,
                    &http_route_resource(api_version),
                );
                for port in &tcp {
                    let route =
                        build_http_route(objects, parent, api_version, &self.base_domain, *port);
                    create_or_replace(&api, &route, nothing_allocated)
                        .await
                        .map_err(|source| PublishError::HttpRoute {
                            port: *port,
                            source,
                        })?;
                }
                let desired: Vec<String> = tcp
                    .iter()
                    .map(|port| route_name(session_id, *port))
                    .collect();
                for stale in known.iter().filter(|name| !desired.contains(name)) {
                    delete_ignoring_absent(&api, stale)
                        .await
                        .map_err(PublishError::DeleteStale)?;
                }
                Ok(self.routes(session_id, &tcp, |port| route_name(session_id, port)))
            }
        }
    }

    fn routes(
        &self,
        session_id: &str,
        tcp: &[u16],
        object: impl Fn(u16) -> String,
    ) -> Vec<PublishedRoute> {
        tcp.iter()
            .map(|port| PublishedRoute {
                host: host_for(&self.base_domain, session_id, *port),
                port: *port,
                object: object(*port),
            })
            .collect()
    }

    fn health(&self, routes: Vec<PublishedRoute>) -> RouteHealth {
        let (verdict, unclaimed_reason): (fn(&DynamicObject) -> Verdict, String) = match &self.layer
        {
            RoutingLayer::Ingress(settings) => (
                ingress_verdict,
                ingress::unclaimed_reason(settings.class.as_deref(), &self.namespace),
            ),
            RoutingLayer::Gateway { parent, .. } => (
                http_route_verdict,
                gateway::unclaimed_reason(parent, &self.namespace),
            ),
        };
        RouteHealth {
            routes,
            verdict,
            ready_timeout: self.ready_timeout,
            unclaimed_reason,
        }
    }
}

async fn delete_ignoring_absent<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(err),
    }
}

/// A session's published routes, to be followed once `running` is out.
pub struct SessionRoutes {
    router: Arc<SessionRouter>,
    /// Every tcp host, whether or not publishing worked.
    hosts: Vec<(String, u16)>,
    /// The routes, or the client-safe reason publishing failed.
    outcome: Result<Vec<PublishedRoute>, String>,
    subscription: RouteSubscription,
}

impl SessionRoutes {
    /// Report the routes' health on the session's event stream until the
    /// session ends. A failed publish is reported at once, per host, and on
    /// the terminal; the session itself runs on.
    pub fn follow(self, sink: SessionSink) {
        let ended = sink.ended();
        self.follow_until(sink, ended);
    }

    /// [`SessionRoutes::follow`] until `stop` (a watch pod taken down while
    /// its session lives on).
    pub fn follow_until(self, sink: SessionSink, stop: tokio_util::sync::CancellationToken) {
        let mut report = SinkReport(sink.clone());
        let routes = match self.outcome {
            Ok(routes) => routes,
            Err(reason) => {
                let reason = format!("could not publish the session route: {reason}");
                sink.output(Bytes::from(format!("\r\n[runner] {reason}\r\n")));
                for (host, port) in &self.hosts {
                    sink.route(host, *port, RouteState::Unprogrammed, Some(reason.clone()));
                }
                return;
            }
        };
        if routes.is_empty() {
            return;
        }
        let health = self.router.health(routes);
        let subscription = self.subscription;
        self.router.tasks.spawn(async move {
            let objects = subscription.objects.clone();
            let read_error = || subscription.read_error();
            health.run(objects, read_error, &mut report, stop).await;
        });
    }
}

struct SinkReport(SessionSink);

impl RouteReport for SinkReport {
    fn route(&mut self, route: &PublishedRoute, state: RouteState, reason: Option<String>) {
        self.0.route(&route.host, route.port, state, reason);
    }

    fn read_error(&mut self, reason: &str) {
        self.0.output(Bytes::from(format!(
            "\r\n[runner] could not read route status: {reason}\r\n"
        )));
    }
}
