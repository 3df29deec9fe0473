//! Which routing layer carries session traffic, decided once at boot
//! (docs/contract.md §9.13). The cluster is asked what it serves elsewhere;
//! this module only decides, so every case is a plain table test.
//!
//! `auto` decides from what is configured before what is installed, and that
//! order is the point: Gateway API CRDs are often present without being the
//! intended path, so "both APIs exist" is no evidence of intent. Only a cluster
//! offering two usable layers with nothing configured is ambiguous, and there
//! the runner refuses to boot — routes published on the wrong layer are never
//! reconciled, and nothing says so.

use runner_core::config::ConfigError;

use crate::config::{GatewayParent, RoutingConfig, RoutingMode, gateway_name_required};

/// Why routing cannot be resolved against what the cluster serves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingRefusal {
    /// Gateway mode on a cluster without the Gateway API.
    #[error(
        "SESSION_ROUTING_MODE=gateway but the cluster does not serve '{GATEWAY_API_GROUP}'. \
         Install the Gateway API CRDs, or set SESSION_ROUTING_MODE=ingress."
    )]
    NoGatewayApi,
    /// Auto mode with both routing APIs usable and nothing saying which.
    #[error(
        "SESSION_ROUTING_MODE=auto cannot choose: this cluster serves '{GATEWAY_API_GROUP}' \
         AND has {class_count} IngressClass(es) with none marked default, and nothing says \
         which should carry session traffic. Set SESSION_ROUTING_MODE=ingress (with \
         SESSION_INGRESS_CLASS) or SESSION_ROUTING_MODE=gateway (with SESSION_GATEWAY_NAME)."
    )]
    AutoCannotChoose { class_count: usize },
    /// Auto mode that landed on the Gateway API with no Gateway named.
    #[error(
        "SESSION_ROUTING_MODE=auto resolved to Gateway API, but SESSION_GATEWAY_NAME is unset \
         \u{2014} a route has to name the Gateway it attaches to, and picking one of several \
         would fail as silently as publishing none. Set SESSION_GATEWAY_NAME (and \
         SESSION_GATEWAY_NAMESPACE when the Gateway is not in '{session_namespace}')."
    )]
    AutoWithoutGatewayName { session_namespace: String },
}

/// The API group of HTTPRoute and Gateway.
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";

/// Served Gateway API versions in order of preference. `v1` is GA; many
/// clusters still serve only `v1beta1`, and a route posted at an unserved
/// version is a 404 at publish time.
pub const GATEWAY_API_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// The annotation by which a cluster nominates the class for Ingresses that
/// name none — which is what the runner creates without `SESSION_INGRESS_CLASS`.
pub const DEFAULT_INGRESS_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// What the cluster can route with, as detected at boot. Both probes fail
/// soft, but a failed IngressClass list is kept as a failure rather than
/// folded into "zero classes": one is a fact about the cluster, the other
/// about this runner's permissions, and the refusal says different things.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingSupport {
    /// The Gateway API version to publish at; `None` when the group is not
    /// served or discovery failed.
    pub gateway_api_version: Option<String>,
    /// The IngressClasses, or the client-safe reason listing them failed
    /// ([`crate::cluster::api_error::api_reason`]).
    pub ingress_classes: Result<IngressClassSummary, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IngressClassSummary {
    pub count: usize,
    /// At least one class carries [`DEFAULT_INGRESS_CLASS_ANNOTATION`] = `true`.
    pub has_default: bool,
}

/// The routing layer sessions are published on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedRouting {
    /// Logs-only; `reason` is said once in the boot log.
    None { reason: String },
    Ingress {
        /// `ingressClassName` of session Ingresses; `None` leaves the choice
        /// to the cluster's default class.
        class: Option<String>,
    },
    Gateway {
        /// `v1` or `v1beta1`.
        api_version: String,
        parent: GatewayParent,
    },
}

/// Whether the decision needs to know what the cluster serves. Without a
/// base domain no host can be built, so no mode consults the cluster.
pub fn needs_detection(config: &RoutingConfig) -> bool {
    config.mode != RoutingMode::None && config.base_domain.is_some()
}

/// The preferred served Gateway API version: the first of
/// [`GATEWAY_API_VERSIONS`] the cluster serves, else the group's preferred
/// version, else none.
pub fn pick_gateway_version(served: &[String], preferred: Option<&str>) -> Option<String> {
    GATEWAY_API_VERSIONS
        .iter()
        .find(|version| served.iter().any(|served| served == *version))
        .map(|version| (*version).to_owned())
        .or_else(|| preferred.map(str::to_owned))
}

/// Decides the routing layer, or refuses the configuration with the message
/// the operator needs.
pub fn decide(
    config: &RoutingConfig,
    support: &RoutingSupport,
    session_namespace: &str,
) -> Result<ResolvedRouting, ConfigError> {
    if config.mode == RoutingMode::None {
        return Ok(ResolvedRouting::None {
            reason: "SESSION_ROUTING_MODE=none".to_owned(),
        });
    }
    // The base domain stays the master switch it always was: no domain, no
    // constructible host, whatever the mode says.
    if config.base_domain.is_none() {
        return Ok(ResolvedRouting::None {
            reason: "SESSION_ROUTING_BASE_DOMAIN is unset, so no session host can be constructed"
                .to_owned(),
        });
    }
    let resolved = decide_layer(config, support, session_namespace)?;
    refuse_tls_under_gateway(config, &resolved)?;
    Ok(resolved)
}

fn decide_layer(
    config: &RoutingConfig,
    support: &RoutingSupport,
    session_namespace: &str,
) -> Result<ResolvedRouting, ConfigError> {
    let ingress = || ResolvedRouting::Ingress {
        class: config.ingress_class_name.clone(),
    };
    let gateway_version = support.gateway_api_version.as_deref();

    match config.mode {
        RoutingMode::Ingress => return Ok(ingress()),
        RoutingMode::Gateway => {
            let Some(api_version) = gateway_version else {
                return Err(ConfigError::refused(RoutingRefusal::NoGatewayApi));
            };
            // Config loading refuses gateway mode without a name; this only
            // meets a hand-built config, and answers it the same way.
            let parent = config
                .gateway
                .clone()
                .ok_or_else(|| gateway_name_required(session_namespace))?;
            return Ok(ResolvedRouting::Gateway {
                api_version: api_version.to_owned(),
                parent,
            });
        }
        RoutingMode::Auto | RoutingMode::None => {}
    }

    // auto: what is configured first.
    if let Some(parent) = &config.gateway {
        let Some(api_version) = gateway_version else {
            return Err(ConfigError::conflict(
                "SESSION_GATEWAY_NAME",
                format!(
                    "the cluster does not serve '{GATEWAY_API_GROUP}'. Install the Gateway API \
                     CRDs, or unset SESSION_GATEWAY_NAME to route via Ingress."
                ),
            ));
        };
        return Ok(ResolvedRouting::Gateway {
            api_version: api_version.to_owned(),
            parent: parent.clone(),
        });
    }
    if config.ingress_class_name.is_some() {
        return Ok(ingress());
    }
    // A default-marked IngressClass is configuration too: the cluster has
    // nominated where an Ingress without a class goes. Ranking it with mere
    // availability would make every cluster with the Gateway CRDs beside a
    // default ingress controller refuse to boot.
    let classes = support.ingress_classes.as_ref();
    if classes.is_ok_and(|classes| classes.has_default) {
        return Ok(ingress());
    }

    // Then what is installed.
    let class_count = classes.map_or(0, |classes| classes.count);
    let gateway_usable = gateway_version.is_some();
    let ingress_usable = class_count > 0;
    if gateway_usable && ingress_usable {
        return Err(ConfigError::refused(RoutingRefusal::AutoCannotChoose {
            class_count,
        }));
    }
    if gateway_usable {
        return Err(ConfigError::refused(
            RoutingRefusal::AutoWithoutGatewayName {
                session_namespace: session_namespace.to_owned(),
            },
        ));
    }
    if ingress_usable {
        return Ok(ingress());
    }
    // Say which it is: reporting a permission failure as "no IngressClass
    // exists" sends the operator to install a controller they already have.
    if let Err(list_failure) = classes {
        return Err(ConfigError::conflict(
            "SESSION_ROUTING_BASE_DOMAIN",
            format!(
                "the routing layer could not be resolved: listing IngressClasses failed \
                 ({list_failure}) and '{GATEWAY_API_GROUP}' is not served. Grant `list` on \
                 `ingressclasses`, or set SESSION_ROUTING_MODE explicitly."
            ),
        ));
    }
    Err(ConfigError::conflict(
        "SESSION_ROUTING_BASE_DOMAIN",
        format!(
            "this cluster offers no usable routing layer: no IngressClass exists and \
             '{GATEWAY_API_GROUP}' is not served. Install an Ingress controller or the Gateway \
             API, or set SESSION_ROUTING_MODE=none to run logs-only."
        ),
    ))
}

/// The origin certificate is checked against the RESOLVED layer as well as at
/// config load: under `auto` a named Gateway wins, so `auto` + Gateway + a TLS
/// secret passed the load-time check and then served plaintext origin traffic
/// under a configuration that reads as TLS-configured.
fn refuse_tls_under_gateway(
    config: &RoutingConfig,
    resolved: &ResolvedRouting,
) -> Result<(), ConfigError> {
    if matches!(resolved, ResolvedRouting::Gateway { .. }) && !config.ingress_annotations.is_empty()
    {
        return Err(crate::config::ingress_annotations_under_gateway());
    }
    if matches!(resolved, ResolvedRouting::Gateway { .. }) && config.tls_secret_name.is_some() {
        return Err(ConfigError::conflict(
            "SESSION_INGRESS_TLS_SECRET",
            "session routing resolved to Gateway API. Under \
             Gateway API the origin certificate belongs to the Gateway listener's own \
             `tls.certificateRefs`, not to the per-session route, so this Secret would be \
             silently ignored. Move the reference to the Gateway and unset this, or set \
             SESSION_ROUTING_MODE=ingress."
                .to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use std::time::Duration;

    const NAMESPACE: &str = "telo-sessions";

    fn auto() -> RoutingConfig {
        RoutingConfig {
            mode: RoutingMode::Auto,
            base_domain: Some("telo.run".into()),
            ingress_class_name: None,
            tls_secret_name: None,
            ingress_annotations: Default::default(),
            gateway: None,
            route_ready_timeout: Duration::from_secs(60),
        }
    }

    fn with_mode(mode: RoutingMode) -> RoutingConfig {
        RoutingConfig { mode, ..auto() }
    }

    fn named_gateway(config: RoutingConfig) -> RoutingConfig {
        RoutingConfig {
            gateway: Some(parent()),
            ..config
        }
    }

    fn parent() -> GatewayParent {
        GatewayParent {
            name: "gw".into(),
            namespace: "gw-ns".into(),
            section_name: None,
        }
    }

    /// A cluster serving `gateway_versions` (preferred first) with `classes`
    /// IngressClasses, the first marked default when `default_class`.
    fn cluster(gateway_versions: &[&str], classes: usize, default_class: bool) -> RoutingSupport {
        let served: Vec<String> = gateway_versions.iter().map(|v| (*v).to_owned()).collect();
        RoutingSupport {
            gateway_api_version: pick_gateway_version(&served, gateway_versions.first().copied()),
            ingress_classes: Ok(IngressClassSummary {
                count: classes,
                has_default: default_class && classes > 0,
            }),
        }
    }

    fn list_forbidden(gateway_versions: &[&str]) -> RoutingSupport {
        RoutingSupport {
            ingress_classes: Err(
                "the runner is not permitted to do this (Forbidden, HTTP 403). \
                 The cluster operator must check the runner's RBAC."
                    .into(),
            ),
            ..cluster(gateway_versions, 0, false)
        }
    }

    fn ingress(class: Option<&str>) -> ResolvedRouting {
        ResolvedRouting::Ingress {
            class: class.map(str::to_owned),
        }
    }

    fn gateway(version: &str) -> ResolvedRouting {
        ResolvedRouting::Gateway {
            api_version: version.into(),
            parent: parent(),
        }
    }

    fn refused(config: &RoutingConfig, support: &RoutingSupport) -> String {
        match decide(config, support, NAMESPACE) {
            Ok(resolved) => panic!("expected a refusal, resolved {resolved:?}"),
            Err(err) => err.to_string(),
        }
    }

    // --- logs-only ---

    #[test]
    fn none_mode_is_logs_only() {
        assert_eq!(
            decide(
                &with_mode(RoutingMode::None),
                &cluster(&["v1"], 1, true),
                NAMESPACE
            ),
            Ok(ResolvedRouting::None {
                reason: "SESSION_ROUTING_MODE=none".into()
            })
        );
    }

    #[rstest]
    #[case(RoutingMode::Auto)]
    #[case(RoutingMode::Ingress)]
    #[case(RoutingMode::Gateway)]
    fn no_base_domain_is_logs_only_whatever_the_mode(#[case] mode: RoutingMode) {
        let config = RoutingConfig {
            base_domain: None,
            ..named_gateway(with_mode(mode))
        };
        assert_eq!(
            decide(&config, &cluster(&[], 1, false), NAMESPACE),
            Ok(ResolvedRouting::None {
                reason: "SESSION_ROUTING_BASE_DOMAIN is unset, so no session host can be \
                         constructed"
                    .into()
            })
        );
    }

    #[rstest]
    #[case(RoutingMode::Auto, Some("telo.run"), true)]
    #[case(RoutingMode::Ingress, Some("telo.run"), true)]
    #[case(RoutingMode::Gateway, Some("telo.run"), true)]
    #[case(RoutingMode::None, Some("telo.run"), false)]
    #[case(RoutingMode::Auto, None, false)]
    #[case(RoutingMode::Gateway, None, false)]
    fn the_cluster_is_asked_only_when_a_host_can_be_built(
        #[case] mode: RoutingMode,
        #[case] base_domain: Option<&str>,
        #[case] expected: bool,
    ) {
        let config = RoutingConfig {
            mode,
            base_domain: base_domain.map(str::to_owned),
            ..auto()
        };
        assert_eq!(needs_detection(&config), expected);
    }

    // --- explicit modes ---

    #[test]
    fn ingress_mode_is_taken_at_its_word() {
        assert_eq!(
            decide(
                &with_mode(RoutingMode::Ingress),
                &cluster(&["v1"], 0, false),
                NAMESPACE
            ),
            Ok(ingress(None))
        );
        let with_class = RoutingConfig {
            ingress_class_name: Some("nginx".into()),
            ..with_mode(RoutingMode::Ingress)
        };
        assert_eq!(
            decide(&with_class, &list_forbidden(&[]), NAMESPACE),
            Ok(ingress(Some("nginx")))
        );
    }

    #[rstest]
    #[case::prefers_ga(&["v1beta1", "v1"], "v1")]
    #[case::falls_back_to_beta(&["v1beta1"], "v1beta1")]
    #[case::else_the_preferred_one(&["v1alpha2"], "v1alpha2")]
    fn gateway_mode_publishes_at_the_best_served_version(
        #[case] served: &[&str],
        #[case] version: &str,
    ) {
        let config = named_gateway(with_mode(RoutingMode::Gateway));
        assert_eq!(
            decide(&config, &cluster(served, 0, false), NAMESPACE),
            Ok(gateway(version))
        );
    }

    #[test]
    fn gateway_mode_is_refused_where_the_api_is_not_served() {
        let config = named_gateway(with_mode(RoutingMode::Gateway));
        assert_eq!(
            refused(&config, &cluster(&[], 1, false)),
            "SESSION_ROUTING_MODE=gateway but the cluster does not serve \
             'gateway.networking.k8s.io'. Install the Gateway API CRDs, or set \
             SESSION_ROUTING_MODE=ingress."
        );
    }

    #[test]
    fn gateway_mode_without_a_parent_is_refused_like_at_config_load() {
        assert_eq!(
            refused(
                &with_mode(RoutingMode::Gateway),
                &cluster(&["v1"], 0, false)
            ),
            "SESSION_ROUTING_MODE=gateway requires SESSION_GATEWAY_NAME — the Gateway each \
             session's HTTPRoute attaches to. Set it (and SESSION_GATEWAY_NAMESPACE when the \
             Gateway is not in 'telo-sessions')."
        );
    }

    // --- auto ---

    #[rstest]
    #[case::named_gateway_beats_usable_ingress(named_gateway(auto()), cluster(&["v1"], 3, false), gateway("v1"))]
    #[case::named_gateway_beats_a_default_class(named_gateway(auto()), cluster(&["v1"], 1, true), gateway("v1"))]
    #[case::named_gateway_with_unreadable_classes(named_gateway(auto()), list_forbidden(&["v1beta1"]), gateway("v1beta1"))]
    #[case::configured_class_beats_served_gateway(
        RoutingConfig { ingress_class_name: Some("nginx".into()), ..auto() },
        cluster(&["v1"], 1, false),
        ingress(Some("nginx"))
    )]
    #[case::configured_class_even_without_classes(
        RoutingConfig { ingress_class_name: Some("nginx".into()), ..auto() },
        list_forbidden(&[]),
        ingress(Some("nginx"))
    )]
    #[case::default_class_beside_gateway(auto(), cluster(&["v1"], 1, true), ingress(None))]
    #[case::default_class_among_several(auto(), cluster(&["v1"], 4, true), ingress(None))]
    #[case::only_ingress_usable(auto(), cluster(&[], 1, false), ingress(None))]
    #[case::only_ingress_usable_several_classes(auto(), cluster(&[], 2, false), ingress(None))]
    fn auto_resolves_from_configuration_before_installation(
        #[case] config: RoutingConfig,
        #[case] support: RoutingSupport,
        #[case] expected: ResolvedRouting,
    ) {
        assert_eq!(decide(&config, &support, NAMESPACE), Ok(expected));
    }

    #[test]
    fn auto_refuses_a_named_gateway_the_cluster_does_not_serve() {
        assert_eq!(
            refused(&named_gateway(auto()), &cluster(&[], 2, true)),
            "SESSION_GATEWAY_NAME is set but the cluster does not serve \
             'gateway.networking.k8s.io'. Install the Gateway API CRDs, or unset \
             SESSION_GATEWAY_NAME to route via Ingress."
        );
    }

    #[rstest]
    #[case(2)]
    #[case(1)]
    fn auto_refuses_when_both_layers_are_usable_and_nothing_says_which(#[case] classes: usize) {
        assert_eq!(
            refused(&auto(), &cluster(&["v1"], classes, false)),
            format!(
                "SESSION_ROUTING_MODE=auto cannot choose: this cluster serves \
                 'gateway.networking.k8s.io' AND has {classes} IngressClass(es) with none marked \
                 default, and nothing says which should carry session traffic. Set \
                 SESSION_ROUTING_MODE=ingress (with SESSION_INGRESS_CLASS) or \
                 SESSION_ROUTING_MODE=gateway (with SESSION_GATEWAY_NAME)."
            )
        );
    }

    #[rstest]
    #[case::no_classes(cluster(&["v1"], 0, false))]
    #[case::classes_unreadable(list_forbidden(&["v1"]))]
    fn auto_refuses_a_gateway_only_cluster_without_a_named_gateway(
        #[case] support: RoutingSupport,
    ) {
        let message = refused(&auto(), &support);
        assert_eq!(
            message,
            "SESSION_ROUTING_MODE=auto resolved to Gateway API, but SESSION_GATEWAY_NAME is unset \
             — a route has to name the Gateway it attaches to, and picking one of several would \
             fail as silently as publishing none. Set SESSION_GATEWAY_NAME (and \
             SESSION_GATEWAY_NAMESPACE when the Gateway is not in 'telo-sessions')."
        );
    }

    #[test]
    fn auto_refuses_a_cluster_with_no_usable_layer() {
        assert_eq!(
            refused(&auto(), &cluster(&[], 0, false)),
            "SESSION_ROUTING_BASE_DOMAIN is set but this cluster offers no usable routing layer: \
             no IngressClass exists and 'gateway.networking.k8s.io' is not served. Install an \
             Ingress controller or the Gateway API, or set SESSION_ROUTING_MODE=none to run \
             logs-only."
        );
    }

    #[test]
    fn a_refused_class_list_is_not_reported_as_no_class_existing() {
        let message = refused(&auto(), &list_forbidden(&[]));
        assert_eq!(
            message,
            "SESSION_ROUTING_BASE_DOMAIN is set but the routing layer could not be resolved: \
             listing IngressClasses failed (the runner is not permitted to do this (Forbidden, \
             HTTP 403). The cluster operator must check the runner's RBAC.) and \
             'gateway.networking.k8s.io' is not served. Grant `list` on `ingressclasses`, or set \
             SESSION_ROUTING_MODE explicitly."
        );
        assert!(!message.contains("no IngressClass exists"));
    }

    // --- origin TLS against the resolved layer ---

    const TLS_UNDER_RESOLVED_GATEWAY: &str = "SESSION_INGRESS_TLS_SECRET is set but session \
        routing resolved to Gateway API. Under Gateway API the origin certificate belongs to the \
        Gateway listener's own `tls.certificateRefs`, not to the per-session route, so this \
        Secret would be silently ignored. Move the reference to the Gateway and unset this, or \
        set SESSION_ROUTING_MODE=ingress.";

    #[test]
    fn a_tls_secret_is_refused_when_auto_resolves_to_gateway() {
        let config = RoutingConfig {
            tls_secret_name: Some("origin-tls".into()),
            ..named_gateway(auto())
        };
        assert_eq!(
            refused(&config, &cluster(&["v1"], 0, false)),
            TLS_UNDER_RESOLVED_GATEWAY
        );
    }

    #[test]
    fn a_tls_secret_in_a_hand_built_gateway_mode_config_is_refused_too() {
        let config = RoutingConfig {
            tls_secret_name: Some("origin-tls".into()),
            ..named_gateway(with_mode(RoutingMode::Gateway))
        };
        assert_eq!(
            refused(&config, &cluster(&["v1"], 0, false)),
            TLS_UNDER_RESOLVED_GATEWAY
        );
    }

    #[rstest]
    #[case::configured_class(RoutingConfig { ingress_class_name: Some("nginx".into()), ..auto() }, ingress(Some("nginx")))]
    #[case::ingress_mode(with_mode(RoutingMode::Ingress), ingress(None))]
    #[case::auto_to_ingress(auto(), ingress(None))]
    fn a_tls_secret_is_kept_when_the_layer_is_ingress(
        #[case] config: RoutingConfig,
        #[case] expected: ResolvedRouting,
    ) {
        let config = RoutingConfig {
            tls_secret_name: Some("origin-tls".into()),
            ..config
        };
        assert_eq!(
            decide(&config, &cluster(&[], 1, false), NAMESPACE),
            Ok(expected)
        );
    }

    // --- version rule ---

    #[rstest]
    #[case(&["v1beta1", "v1"], Some("v1beta1"), Some("v1"))]
    #[case(&["v1beta1"], Some("v1beta1"), Some("v1beta1"))]
    #[case(&["v1alpha2", "v1beta1"], Some("v1alpha2"), Some("v1beta1"))]
    #[case(&["v1alpha2"], Some("v1alpha2"), Some("v1alpha2"))]
    #[case(&[], Some("v2"), Some("v2"))]
    #[case(&[], None, None)]
    fn the_gateway_version_prefers_v1_then_v1beta1_then_the_group_preference(
        #[case] served: &[&str],
        #[case] preferred: Option<&str>,
        #[case] expected: Option<&str>,
    ) {
        let served: Vec<String> = served.iter().map(|v| (*v).to_owned()).collect();
        assert_eq!(
            pick_gateway_version(&served, preferred),
            expected.map(str::to_owned)
        );
    }
}
