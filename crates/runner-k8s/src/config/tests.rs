use super::*;
use rstest::rstest;
use runner_core::config::{CORE_SETTINGS, env_from_pairs};
use runner_workspace_service::WORKSPACE_LIMIT_SETTINGS;

const SELF_URL: (&str, &str) = ("RUNNER_SELF_URL", "http://runner.test:8062");

/// A minimal valid environment plus `pairs` (later keys win).
fn env_with(pairs: &[(&str, &str)]) -> Env {
    let mut env = env_from_pairs(&[SELF_URL]);
    env.extend(env_from_pairs(pairs));
    env
}

fn load(pairs: &[(&str, &str)]) -> Result<K8sConfig, ConfigError> {
    load_k8s_config(&env_with(pairs))
}

fn error(pairs: &[(&str, &str)]) -> String {
    match load(pairs) {
        Ok(config) => panic!("expected a config error, loaded {config:?}"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn only_the_self_url_is_required_and_everything_else_has_its_default() {
    let config = load(&[]).unwrap();
    assert_eq!(config.core, load_core_config(&Env::new(), 8062).unwrap());
    assert_eq!(config.core.port, 8062);
    assert_eq!(config.display_name, "Telo Runner");
    assert_eq!(
        config.description,
        "Runs the Telo application in a cloud environment"
    );
    assert_eq!(config.session_namespace, "telo-sessions");
    assert_eq!(config.default_image, "telorun/node:latest-slim");
    assert_eq!(config.init_image, "busybox:stable");
    assert_eq!(config.image_pull_secret, None);
    assert_eq!(config.runtime_class, None);
    assert_eq!(config.self_url, "http://runner.test:8062");
    assert_eq!(config.managed_by, "telo-k8s-runner");
    assert_eq!(
        config.limits,
        LimitCeilings {
            cpu: "500m".into(),
            memory: "512Mi".into(),
            ttl_seconds: 3600,
            ephemeral_storage: "1Gi".into(),
        }
    );
    assert_eq!(
        config.app_limits,
        LimitCeilings {
            cpu: "500m".into(),
            memory: "512Mi".into(),
            ttl_seconds: 21_600,
            ephemeral_storage: "1Gi".into(),
        }
    );
    assert_eq!(
        config.routing,
        RoutingConfig {
            mode: RoutingMode::Auto,
            base_domain: None,
            ingress_class_name: None,
            tls_secret_name: None,
            ingress_annotations: Default::default(),
            gateway: None,
            route_ready_timeout: Duration::from_secs(60),
        }
    );
    assert_eq!(
        config.telo_images,
        TeloImageSource {
            repository: "telorun/node".into(),
            variant: "slim".into(),
            unreleased: None,
            pull_policy: PullPolicy::Missing,
        }
    );
    assert_eq!(
        config.base_image_catalog,
        BaseImageCatalogConfig {
            enabled: true,
            repository: "telorun/node".into(),
            filter: TagFilter {
                pinned_only: true,
                exclude_sha: true,
                exclude_prerelease: true,
                include: None,
                exclude: None,
            },
            limit: 20,
            refresh_interval: Duration::from_secs(3600),
            hub_url: "https://hub.docker.com".into(),
        }
    );
    assert_eq!(config.orphan_policy, OrphanPolicy::Adopt);
    assert_eq!(config.start_deadline, Duration::from_secs(120));
    assert_eq!(config.warm_pool_surge, DEFAULT_WARM_POOL_SURGE);
    assert_eq!(
        config.warm_pool_modules,
        ["http-server", "run", "console", "javascript"]
    );
}

#[test]
fn every_variable_overrides_its_default() {
    let config = load(&[
        ("PORT", "9000"),
        ("RUNNER_DISPLAY_NAME", " Cluster "),
        ("RUNNER_DESCRIPTION", "Runs in the lab"),
        ("RUNNER_SESSION_NAMESPACE", "lab"),
        ("RUNNER_IMAGE", "telorun/node:0.30.1-slim"),
        ("RUNNER_INIT_IMAGE", "busybox:1.36"),
        ("RUNNER_IMAGE_PULL_SECRET", "pull"),
        ("RUNNER_RUNTIME_CLASS", "gvisor"),
        ("RUNNER_MANAGED_BY", "lab-runner"),
        ("RUNNER_MAX_CPU", "250m"),
        ("RUNNER_MAX_MEMORY", "256Mi"),
        ("RUNNER_MAX_TTL_SECONDS", "600"),
        ("RUNNER_MAX_EPHEMERAL_STORAGE", "2Gi"),
        ("RUNNER_APP_MAX_CPU", "1"),
        ("RUNNER_APP_MAX_MEMORY", "1Gi"),
        ("RUNNER_APP_MAX_TTL_SECONDS", "7200"),
        ("RUNNER_APP_MAX_EPHEMERAL_STORAGE", "4Gi"),
        ("RUNNER_BASE_IMAGE_CATALOG_ENABLED", "no"),
        ("RUNNER_BASE_IMAGE_REPO", "acme/node"),
        ("RUNNER_BASE_IMAGE_PINNED_ONLY", "false"),
        ("RUNNER_BASE_IMAGE_EXCLUDE_SHA", "0"),
        ("RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE", "No"),
        ("RUNNER_BASE_IMAGE_INCLUDE", " ^\\d+\\.\\d+ "),
        ("RUNNER_BASE_IMAGE_EXCLUDE", "-slim$"),
        ("RUNNER_BASE_IMAGE_LIMIT", "5"),
        ("RUNNER_BASE_IMAGE_REFRESH_SECONDS", "60"),
        ("RUNNER_DOCKER_HUB_URL", "http://127.0.0.1:9999/"),
        ("SESSION_ROUTING_MODE", "ingress"),
        ("SESSION_ROUTING_BASE_DOMAIN", "telo.run"),
        ("SESSION_INGRESS_CLASS", "nginx"),
        ("SESSION_INGRESS_TLS_SECRET", "origin-tls"),
        ("SESSION_ROUTE_READY_TIMEOUT_SECONDS", "5"),
        ("RUNNER_ORPHAN_POLICY", "reap"),
        ("RUNNER_START_DEADLINE_SECONDS", "30"),
        ("RUNNER_WARM_POOL_SURGE", " 7 "),
        (
            "RUNNER_WARM_POOL_MODULES",
            " http-server , kv-store-memory,s3 ",
        ),
        ("RUNNER_TELO_IMAGE_REPOSITORY", " registry.lab/telo "),
        ("RUNNER_TELO_IMAGE_VARIANT", "bookworm"),
        ("RUNNER_TELO_UNRELEASED_IMAGE", "registry.lab/telo:dev"),
        ("RUNNER_PULL_POLICY", "always"),
    ])
    .unwrap();
    assert_eq!(
        config.telo_images,
        TeloImageSource {
            repository: "registry.lab/telo".into(),
            variant: "bookworm".into(),
            unreleased: Some("registry.lab/telo:dev".into()),
            pull_policy: PullPolicy::Always,
        }
    );
    assert_eq!(config.core.port, 9000);
    assert_eq!(
        config.warm_pool_modules,
        ["http-server", "kv-store-memory", "s3"]
    );
    assert_eq!(config.display_name, "Cluster");
    assert_eq!(config.description, "Runs in the lab");
    assert_eq!(config.session_namespace, "lab");
    assert_eq!(config.default_image, "telorun/node:0.30.1-slim");
    assert_eq!(config.init_image, "busybox:1.36");
    assert_eq!(config.image_pull_secret.as_deref(), Some("pull"));
    assert_eq!(config.runtime_class.as_deref(), Some("gvisor"));
    assert_eq!(config.managed_by, "lab-runner");
    assert_eq!(
        config.limits,
        LimitCeilings {
            cpu: "250m".into(),
            memory: "256Mi".into(),
            ttl_seconds: 600,
            ephemeral_storage: "2Gi".into(),
        }
    );
    assert_eq!(
        config.app_limits,
        LimitCeilings {
            cpu: "1".into(),
            memory: "1Gi".into(),
            ttl_seconds: 7200,
            ephemeral_storage: "4Gi".into(),
        }
    );
    assert_eq!(
        config.base_image_catalog,
        BaseImageCatalogConfig {
            enabled: false,
            repository: "acme/node".into(),
            filter: TagFilter {
                pinned_only: false,
                exclude_sha: false,
                exclude_prerelease: false,
                include: Some("^\\d+\\.\\d+".into()),
                exclude: Some("-slim$".into()),
            },
            limit: 5,
            refresh_interval: Duration::from_secs(60),
            hub_url: "http://127.0.0.1:9999".into(),
        }
    );
    assert_eq!(
        config.routing,
        RoutingConfig {
            mode: RoutingMode::Ingress,
            base_domain: Some("telo.run".into()),
            ingress_class_name: Some("nginx".into()),
            tls_secret_name: Some("origin-tls".into()),
            ingress_annotations: Default::default(),
            gateway: None,
            route_ready_timeout: Duration::from_secs(5),
        }
    );
    assert_eq!(config.orphan_policy, OrphanPolicy::Reap);
    assert_eq!(config.start_deadline, Duration::from_secs(30));
    assert_eq!(config.warm_pool_surge, 7);
}

#[rstest]
#[case::unset(None)]
#[case::empty(Some(""))]
#[case::blank(Some(" \t "))]
#[case::only_slashes(Some("///"))]
fn a_missing_self_url_is_refused_with_the_reference_sentence(#[case] raw: Option<&str>) {
    let env = match raw {
        Some(raw) => env_from_pairs(&[("RUNNER_SELF_URL", raw)]),
        None => Env::new(),
    };
    assert_eq!(
        load_k8s_config(&env).map_err(|err| err.to_string()),
        Err(
            "RUNNER_SELF_URL env var is required. Set it to the runner's in-cluster base URL \
             (e.g. http://k8s-runner.telo-runner.svc:8062) so session initContainers can \
             fetch the bundle."
                .to_owned()
        )
    );
}

#[rstest]
#[case("http://runner:8062/", "http://runner:8062")]
#[case(" http://runner:8062/// ", "http://runner:8062")]
#[case("http://runner:8062/base/", "http://runner:8062/base")]
#[case("http://runner:8062", "http://runner:8062")]
fn the_self_url_loses_its_trailing_slashes(#[case] raw: &str, #[case] expected: &str) {
    let config = load(&[("RUNNER_SELF_URL", raw)]).unwrap();
    assert_eq!(config.self_url, expected);
}

#[test]
fn the_self_url_is_checked_before_anything_else() {
    let env = env_from_pairs(&[
        ("PORT", ""),
        ("SESSION_ROUTING_MODE", "bogus"),
        ("RUNNER_MAX_TTL_SECONDS", "x"),
    ]);
    let Err(err) = load_k8s_config(&env) else {
        panic!("expected an error");
    };
    let message = err.to_string();
    assert!(message.starts_with("RUNNER_SELF_URL env var is required."));
}

#[rstest]
#[case::core_before_routing(
    &[("PORT", "0"), ("SESSION_ROUTING_MODE", "bogus")],
    "PORT must be an integer in 1..65535, got '0'."
)]
#[case::routing_before_limits(
    &[("SESSION_ROUTING_MODE", "bogus"), ("RUNNER_MAX_TTL_SECONDS", "x")],
    "SESSION_ROUTING_MODE must be one of auto | ingress | gateway | none (got 'bogus')."
)]
#[case::limits_before_app_limits(
    &[("RUNNER_MAX_TTL_SECONDS", "x"), ("RUNNER_APP_MAX_TTL_SECONDS", "y")],
    "RUNNER_MAX_TTL_SECONDS must be a positive integer, got 'x'."
)]
#[case::app_limits_before_catalog(
    &[("RUNNER_APP_MAX_TTL_SECONDS", "y"), ("RUNNER_BASE_IMAGE_LIMIT", "z")],
    "RUNNER_APP_MAX_TTL_SECONDS must be a positive integer, got 'y'."
)]
#[case::catalog_before_our_additions(
    &[("RUNNER_BASE_IMAGE_LIMIT", "z"), ("RUNNER_ORPHAN_POLICY", "keep")],
    "RUNNER_BASE_IMAGE_LIMIT must be a positive integer, got 'z'."
)]
fn the_first_invalid_variable_in_reference_order_is_reported(
    #[case] pairs: &[(&str, &str)],
    #[case] message: &str,
) {
    assert_eq!(error(pairs), message);
}

#[rstest]
#[case(None, RoutingMode::Auto)]
#[case(Some(""), RoutingMode::Auto)]
#[case(Some("  "), RoutingMode::Auto)]
#[case(Some("auto"), RoutingMode::Auto)]
#[case(Some("ingress"), RoutingMode::Ingress)]
#[case(Some(" none "), RoutingMode::None)]
fn routing_modes_are_read_exactly(#[case] raw: Option<&str>, #[case] mode: RoutingMode) {
    let pairs: Vec<(&str, &str)> = raw
        .map(|raw| ("SESSION_ROUTING_MODE", raw))
        .into_iter()
        .collect();
    assert_eq!(load(&pairs).unwrap().routing.mode, mode);
}

#[rstest]
#[case("Auto", "Auto")]
#[case("ingres", "ingres")]
#[case(" GATEWAY ", "GATEWAY")]
#[case("auto,ingress", "auto,ingress")]
fn a_mistyped_routing_mode_is_refused_not_read_as_auto(#[case] raw: &str, #[case] shown: &str) {
    assert_eq!(
        error(&[("SESSION_ROUTING_MODE", raw)]),
        format!(
            "SESSION_ROUTING_MODE must be one of auto | ingress | gateway | none (got '{shown}')."
        )
    );
}

const TLS_UNDER_GATEWAY: &str = "SESSION_INGRESS_TLS_SECRET is set but \
    SESSION_ROUTING_MODE=gateway. Under Gateway API the origin certificate belongs to the \
    Gateway listener's own `tls.certificateRefs`, not to the per-session route. Move the \
    Secret reference to the Gateway and unset this.";

#[rstest]
#[case::with_a_gateway(&[("SESSION_GATEWAY_NAME", "public")])]
#[case::before_the_missing_gateway_name(&[])]
fn a_tls_secret_is_refused_in_gateway_mode(#[case] extra: &[(&str, &str)]) {
    let mut pairs = vec![
        ("SESSION_ROUTING_MODE", "gateway"),
        ("SESSION_INGRESS_TLS_SECRET", "origin-tls"),
    ];
    pairs.extend_from_slice(extra);
    assert_eq!(error(&pairs), TLS_UNDER_GATEWAY);
}

#[rstest]
#[case(None, "telo-sessions")]
#[case(Some("lab"), "lab")]
fn gateway_mode_requires_a_gateway_name(#[case] namespace: Option<&str>, #[case] shown: &str) {
    let mut pairs = vec![("SESSION_ROUTING_MODE", "gateway")];
    pairs.extend(namespace.map(|ns| ("RUNNER_SESSION_NAMESPACE", ns)));
    assert_eq!(
        error(&pairs),
        format!(
            "SESSION_ROUTING_MODE=gateway requires SESSION_GATEWAY_NAME — the Gateway each \
             session's HTTPRoute attaches to. Set it (and SESSION_GATEWAY_NAMESPACE when the \
             Gateway is not in '{shown}')."
        )
    );
}

#[rstest]
#[case::auto_with_tls("auto")]
#[case::ingress_with_tls("ingress")]
#[case::none_with_tls("none")]
fn a_tls_secret_outside_gateway_mode_is_left_to_the_routing_decision(#[case] mode: &str) {
    let config = load(&[
        ("SESSION_ROUTING_MODE", mode),
        ("SESSION_INGRESS_TLS_SECRET", "origin-tls"),
        ("SESSION_GATEWAY_NAME", "public"),
    ])
    .unwrap();
    assert_eq!(
        config.routing.tls_secret_name.as_deref(),
        Some("origin-tls")
    );
}

#[test]
fn the_gateway_namespace_defaults_to_the_session_namespace() {
    let config = load(&[
        ("RUNNER_SESSION_NAMESPACE", "lab"),
        ("SESSION_ROUTING_MODE", "gateway"),
        ("SESSION_GATEWAY_NAME", " public "),
        ("SESSION_GATEWAY_NAMESPACE", "  "),
    ])
    .unwrap();
    assert_eq!(
        config.routing.gateway,
        Some(GatewayParent {
            name: "public".into(),
            namespace: "lab".into(),
            section_name: None,
        })
    );
}

#[test]
fn a_named_gateway_carries_its_namespace_and_listener() {
    let config = load(&[
        ("SESSION_GATEWAY_NAME", "public"),
        ("SESSION_GATEWAY_NAMESPACE", "gateway-system"),
        ("SESSION_GATEWAY_SECTION_NAME", "https"),
    ])
    .unwrap();
    assert_eq!(config.routing.mode, RoutingMode::Auto);
    assert_eq!(
        config.routing.gateway,
        Some(GatewayParent {
            name: "public".into(),
            namespace: "gateway-system".into(),
            section_name: Some("https".into()),
        })
    );
}

#[test]
fn gateway_details_without_a_name_configure_no_gateway() {
    let config = load(&[
        ("SESSION_GATEWAY_NAMESPACE", "gateway-system"),
        ("SESSION_GATEWAY_SECTION_NAME", "https"),
    ])
    .unwrap();
    assert_eq!(config.routing.gateway, None);
}

#[test]
fn watch_pools_are_read_like_run_pools() {
    let config = load(&[
        ("RUNNER_WATCH_SESSIONS", "true"),
        (
            "RUNNER_WARM_POOL_WATCH",
            " telorun/node:0-slim=2 , registry.lab/telo:dev=0 ",
        ),
    ])
    .unwrap();
    assert_eq!(
        config.watch_pools,
        vec![
            PoolSpec {
                image: "telorun/node:0-slim".into(),
                size: 2,
            },
            PoolSpec {
                image: "registry.lab/telo:dev".into(),
                size: 0,
            },
        ]
    );
    assert!(config.warm_pools.is_empty(), "run pools are their own");
    assert!(load(&[]).unwrap().watch_pools.is_empty());
}

#[rstest]
#[case("telorun/node:0-slim")]
#[case("telorun/node:0-slim=two")]
#[case("telorun/node:0-slim=101")]
#[case("telorun/node:0-slim=-1")]
#[case("=1")]
#[case("a b=1")]
#[case("a=1,a=2")]
fn a_watch_pool_that_is_not_image_counts_is_refused(#[case] raw: &str) {
    assert_eq!(
        error(&[
            ("RUNNER_WATCH_SESSIONS", "true"),
            ("RUNNER_WARM_POOL_WATCH", raw)
        ]),
        format!(
            "RUNNER_WARM_POOL_WATCH must be a comma-separated list of <image>=<count>, each image once, counts 0 to 100, got '{raw}'."
        )
    );
}

/// A pool of watch pods no session could claim is a configuration mistake;
/// an empty one is not.
#[test]
fn a_watch_pool_without_watch_sessions_is_refused() {
    assert_eq!(
        error(&[("RUNNER_WARM_POOL_WATCH", "telorun/node:0-slim=2")]),
        "RUNNER_WARM_POOL_WATCH must be empty unless RUNNER_WATCH_SESSIONS is true, got 'telorun/node:0-slim=2'."
    );
    assert!(
        load(&[("RUNNER_WARM_POOL_WATCH", "telorun/node:0-slim=0")])
            .unwrap()
            .watch_pools
            .iter()
            .all(|pool| pool.size == 0)
    );
}

#[rstest]
#[case("0")]
#[case("-1")]
#[case("101")]
#[case("2.5")]
#[case("two")]
#[case("18446744073709551616")]
fn a_warm_pool_surge_that_is_not_a_pod_count_is_refused(#[case] raw: &str) {
    assert_eq!(
        error(&[("RUNNER_WARM_POOL_SURGE", raw)]),
        format!(
            "RUNNER_WARM_POOL_SURGE must be a whole number of pods from 1 to 100, got '{raw}'."
        )
    );
}

#[rstest]
#[case("RUNNER_MAX_TTL_SECONDS", "0")]
#[case("RUNNER_MAX_TTL_SECONDS", "1h")]
#[case("RUNNER_APP_MAX_TTL_SECONDS", "-5")]
#[case("RUNNER_BASE_IMAGE_LIMIT", "2.5")]
#[case("RUNNER_BASE_IMAGE_REFRESH_SECONDS", "soon")]
#[case("SESSION_ROUTE_READY_TIMEOUT_SECONDS", "0")]
#[case("RUNNER_START_DEADLINE_SECONDS", "two minutes")]
fn whole_number_variables_refuse_anything_else(#[case] key: &str, #[case] raw: &str) {
    assert_eq!(
        error(&[(key, raw)]),
        format!("{key} must be a positive integer, got '{raw}'.")
    );
}

#[rstest]
#[case("RUNNER_BASE_IMAGE_CATALOG_ENABLED")]
#[case("RUNNER_BASE_IMAGE_PINNED_ONLY")]
#[case("RUNNER_BASE_IMAGE_EXCLUDE_SHA")]
#[case("RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE")]
fn boolean_variables_refuse_other_words(#[case] key: &str) {
    assert_eq!(
        error(&[(key, "maybe")]),
        format!("{key} must be a boolean (true/false), got 'maybe'.")
    );
}

#[rstest]
#[case("RUNNER_BASE_IMAGE_INCLUDE", "(unclosed")]
#[case("RUNNER_BASE_IMAGE_EXCLUDE", "[z-a]")]
#[case("RUNNER_BASE_IMAGE_INCLUDE", "a{2,1}")]
fn an_invalid_tag_pattern_stops_the_boot(#[case] key: &str, #[case] pattern: &str) {
    let cause = regex::Regex::new(pattern).unwrap_err();
    assert_eq!(
        error(&[(key, pattern)]),
        format!("{key} is not a valid regular expression: {cause}")
    );
}

#[test]
fn blank_tag_patterns_mean_no_filter() {
    let config = load(&[
        ("RUNNER_BASE_IMAGE_INCLUDE", " "),
        ("RUNNER_BASE_IMAGE_EXCLUDE", ""),
    ])
    .unwrap();
    assert_eq!(config.base_image_catalog.filter.include, None);
    assert_eq!(config.base_image_catalog.filter.exclude, None);
}

#[rstest]
#[case(None, OrphanPolicy::Adopt)]
#[case(Some(""), OrphanPolicy::Adopt)]
#[case(Some("adopt"), OrphanPolicy::Adopt)]
#[case(Some(" reap "), OrphanPolicy::Reap)]
fn the_orphan_policy_is_adopt_or_reap(#[case] raw: Option<&str>, #[case] policy: OrphanPolicy) {
    let pairs: Vec<(&str, &str)> = raw
        .map(|raw| ("RUNNER_ORPHAN_POLICY", raw))
        .into_iter()
        .collect();
    assert_eq!(load(&pairs).unwrap().orphan_policy, policy);
}

#[rstest]
#[case("delete", "delete")]
#[case("Reap", "Reap")]
#[case(" keep ", "keep")]
fn an_unknown_orphan_policy_is_refused(#[case] raw: &str, #[case] shown: &str) {
    assert_eq!(
        error(&[("RUNNER_ORPHAN_POLICY", raw)]),
        format!("RUNNER_ORPHAN_POLICY must be one of adopt | reap (got '{shown}').")
    );
}

#[rstest]
#[case("https://hub.example.test", "https://hub.example.test")]
#[case("http://127.0.0.1:8080//", "http://127.0.0.1:8080")]
#[case("  ", "https://hub.docker.com")]
fn the_docker_hub_url_is_configurable(#[case] raw: &str, #[case] expected: &str) {
    let config = load(&[("RUNNER_DOCKER_HUB_URL", raw)]).unwrap();
    assert_eq!(config.base_image_catalog.hub_url, expected);
}

#[rstest]
#[case("hub.docker.com", "hub.docker.com")]
#[case("ftp://mirror", "ftp://mirror")]
#[case(" https:// ", "https://")]
fn a_docker_hub_url_without_scheme_or_host_is_refused(#[case] raw: &str, #[case] shown: &str) {
    assert_eq!(
        error(&[("RUNNER_DOCKER_HUB_URL", raw)]),
        format!("RUNNER_DOCKER_HUB_URL must be an http:// or https:// URL (got '{shown}').")
    );
}

#[test]
fn variables_of_removed_features_are_neither_required_nor_read() {
    let baseline = load(&[]).unwrap();
    let with_removed = load(&[
        ("RUNNER_IMAGE_REPOSITORY", "registry.test/sessions"),
        ("RUNNER_BUILD_NAMESPACE", "telo-builds"),
        (
            "RUNNER_BUILDER_IMAGE",
            "gcr.io/kaniko-project/executor:latest",
        ),
        ("RUNNER_BUILD_TIMEOUT_SECONDS", "not-a-number"),
        ("RUNNER_REGISTRY_INSECURE", "perhaps"),
        ("RUNNER_REGISTRY_API_URL", "http://registry.test"),
        ("RUNNER_REGISTRY_PUSH_SECRET", "push"),
        ("RUNNER_INGRESS_BASE_DOMAIN", "old.test"),
        ("RUNNER_INGRESS_CLASS", "old"),
        ("SESSION_INGRESS_BASE_DOMAIN", "old.test"),
    ])
    .unwrap();
    assert_eq!(with_removed, baseline);
    assert_eq!(with_removed.routing.base_domain, None);
}

#[rstest]
#[case(None, PullPolicy::Missing)]
#[case(Some(" "), PullPolicy::Missing)]
#[case(Some("missing"), PullPolicy::Missing)]
#[case(Some("always"), PullPolicy::Always)]
#[case(Some(" never "), PullPolicy::Never)]
fn the_pull_policy_is_missing_always_or_never(
    #[case] raw: Option<&str>,
    #[case] policy: PullPolicy,
) {
    let pairs: Vec<(&str, &str)> = raw
        .map(|raw| ("RUNNER_PULL_POLICY", raw))
        .into_iter()
        .collect();
    assert_eq!(load(&pairs).unwrap().telo_images.pull_policy, policy);
}

#[rstest]
#[case("Always", "Always")]
#[case("IfNotPresent", "IfNotPresent")]
#[case(" sometimes ", "sometimes")]
fn an_unknown_pull_policy_is_refused(#[case] raw: &str, #[case] shown: &str) {
    assert_eq!(
        error(&[("RUNNER_PULL_POLICY", raw)]),
        format!("RUNNER_PULL_POLICY must be one of missing, always, never, got '{shown}'.")
    );
}

#[test]
fn blank_telo_image_variables_keep_their_defaults() {
    let config = load(&[
        ("RUNNER_TELO_IMAGE_REPOSITORY", "  "),
        ("RUNNER_TELO_IMAGE_VARIANT", ""),
        ("RUNNER_TELO_UNRELEASED_IMAGE", " "),
    ])
    .unwrap();
    assert_eq!(config.telo_images, TeloImageSource::default());
}

#[test]
fn the_documented_defaults_are_what_unset_means() {
    // PORT is the core's, documented as 8061; this backend's is 8062.
    runner_core::setting::assert_documented_defaults_are_the_defaults(
        &[K8S_SETTINGS, WORKSPACE_LIMIT_SETTINGS],
        |env| {
            let mut env = env.clone();
            env.extend(env_from_pairs(&[SELF_URL]));
            load_k8s_config(&env)
        },
    );
    assert_eq!(load(&[]).unwrap().warm_pool_surge, DEFAULT_WARM_POOL_SURGE);
}

#[test]
fn the_loader_reads_exactly_the_documented_variables() {
    runner_core::setting::assert_reads_exactly(
        &[CORE_SETTINGS, K8S_SETTINGS, WORKSPACE_LIMIT_SETTINGS],
        // Read by the binary's logging and by the cluster client.
        &["LOG_FORMAT", "KUBECONFIG"],
        &[
            env_with(&[]),
            // The terms' title and version are read beside a body, the
            // Gateway's namespace and section beside its name.
            env_with(&[
                ("RUNNER_TERMS_BODY", "Be nice."),
                ("SESSION_GATEWAY_NAME", "gw"),
            ]),
        ],
        load_k8s_config,
    );
}

#[test]
fn the_documentation_table_names_each_variable_once() {
    let mut names: Vec<&str> = K8S_SETTINGS.iter().map(|doc| doc.name).collect();
    let total = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), total, "a variable is documented twice");
    for core in CORE_SETTINGS {
        assert!(
            !names.contains(&core.name),
            "{} is already documented by the core",
            core.name
        );
    }
    for name in [
        "RUNNER_SELF_URL",
        "RUNNER_DISPLAY_NAME",
        "RUNNER_DESCRIPTION",
        "RUNNER_SESSION_NAMESPACE",
        "RUNNER_IMAGE",
        "RUNNER_INIT_IMAGE",
        "RUNNER_IMAGE_PULL_SECRET",
        "RUNNER_RUNTIME_CLASS",
        "RUNNER_MANAGED_BY",
        "RUNNER_MAX_CPU",
        "RUNNER_MAX_MEMORY",
        "RUNNER_MAX_TTL_SECONDS",
        "RUNNER_MAX_EPHEMERAL_STORAGE",
        "RUNNER_APP_MAX_CPU",
        "RUNNER_APP_MAX_MEMORY",
        "RUNNER_APP_MAX_TTL_SECONDS",
        "RUNNER_APP_MAX_EPHEMERAL_STORAGE",
        "RUNNER_BASE_IMAGE_CATALOG_ENABLED",
        "RUNNER_BASE_IMAGE_REPO",
        "RUNNER_BASE_IMAGE_PINNED_ONLY",
        "RUNNER_BASE_IMAGE_EXCLUDE_SHA",
        "RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE",
        "RUNNER_BASE_IMAGE_INCLUDE",
        "RUNNER_BASE_IMAGE_EXCLUDE",
        "RUNNER_BASE_IMAGE_LIMIT",
        "RUNNER_BASE_IMAGE_REFRESH_SECONDS",
        "RUNNER_DOCKER_HUB_URL",
        "SESSION_ROUTING_MODE",
        "SESSION_ROUTING_BASE_DOMAIN",
        "SESSION_INGRESS_CLASS",
        "SESSION_INGRESS_TLS_SECRET",
        "SESSION_GATEWAY_NAME",
        "SESSION_GATEWAY_NAMESPACE",
        "SESSION_GATEWAY_SECTION_NAME",
        "SESSION_ROUTE_READY_TIMEOUT_SECONDS",
        "RUNNER_ORPHAN_POLICY",
        "RUNNER_START_DEADLINE_SECONDS",
        "RUNNER_WARM_POOL_SURGE",
        "RUNNER_WARM_POOL_WATCH",
        "RUNNER_TELO_IMAGE_REPOSITORY",
        "RUNNER_TELO_IMAGE_VARIANT",
        "RUNNER_TELO_UNRELEASED_IMAGE",
        "RUNNER_PULL_POLICY",
        "KUBECONFIG",
    ] {
        assert!(names.contains(&name), "{name} is undocumented");
    }
}

#[rstest]
#[case("none", &[])]
#[case(" none ", &[])]
#[case("", &["http-server", "run", "console", "javascript"])]
#[case("  ", &["http-server", "run", "console", "javascript"])]
#[case("run", &["run"])]
fn warm_pool_modules_may_be_none_or_the_default(#[case] raw: &str, #[case] expected: &[&str]) {
    let config = load(&[("RUNNER_WARM_POOL_MODULES", raw)]).unwrap();
    assert_eq!(config.warm_pool_modules, expected);
}

#[rstest]
#[case("http-server,,run")]
#[case("run,run")]
#[case("Http-Server")]
#[case("http_server")]
#[case("-run")]
#[case("run-")]
#[case("http--server")]
#[case("../etc")]
#[case("none,run")]
#[case("a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t,u,v,w,x,y,z,a1,b1,c1,d1,e1,f1,g1")]
fn warm_pool_modules_that_are_not_module_names_are_refused(#[case] raw: &str) {
    assert_eq!(
        error(&[("RUNNER_WARM_POOL_MODULES", raw)]),
        format!(
            "RUNNER_WARM_POOL_MODULES must be none or a comma-separated list of at most 32 module names (lowercase letters and digits, words joined by single dashes), each once, got '{raw}'."
        )
    );
}

/// A peer token file holding `contents`, kept for the test's life.
fn token_file(contents: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peer-token");
    std::fs::write(&path, contents).unwrap();
    let path = path.to_str().unwrap().to_owned();
    (dir, path)
}

#[test]
fn replication_is_off_without_a_peer_token_file() {
    let config = load(&[("POD_NAME", "runner-0"), ("POD_IP", "10.0.0.7")]).unwrap();
    assert_eq!(config.replication, None);
}

#[test]
fn a_replica_is_named_and_reached_from_the_downward_api_by_default() {
    let (_dir, path) = token_file(&format!("{}\n", "s".repeat(40)));
    let config = load(&[
        ("RUNNER_PEER_TOKEN_FILE", path.as_str()),
        ("POD_NAME", "telo-k8s-runner-7c9f-x2"),
        ("POD_IP", "10.0.0.7"),
        ("HOSTNAME", "ignored"),
    ])
    .unwrap();
    let replication = config.replication.unwrap();
    assert_eq!(replication.id, "telo-k8s-runner-7c9f-x2");
    assert_eq!(replication.url, "http://10.0.0.7:8062");
    assert_eq!(replication.token, PeerTokenText("s".repeat(40)));
    assert_eq!(replication.lease_duration, Duration::from_secs(15));
    assert_eq!(format!("{:?}", replication.token), "PeerTokenText(…)");

    let v6 = load(&[
        ("RUNNER_PEER_TOKEN_FILE", path.as_str()),
        ("HOSTNAME", "runner-b"),
        ("POD_IP", "fd00::7"),
        ("PORT", "9000"),
        ("RUNNER_LEASE_DURATION_SECONDS", "30"),
    ])
    .unwrap()
    .replication
    .unwrap();
    assert_eq!(v6.id, "runner-b");
    assert_eq!(v6.url, "http://[fd00::7]:9000");
    assert_eq!(v6.lease_duration, Duration::from_secs(30));
}

#[rstest]
#[case::unreadable(
    &[("RUNNER_PEER_TOKEN_FILE", "/nonexistent/peer-token")],
    "RUNNER_PEER_TOKEN_FILE '/nonexistent/peer-token' could not be read: No such file or directory (os error 2)"
)]
#[case::no_name(
    &[("POD_IP", "10.0.0.7")],
    "RUNNER_PEER_TOKEN_FILE is set but this replica has no name: set RUNNER_REPLICA_ID (or POD_NAME from the downward API)."
)]
#[case::no_address(
    &[("RUNNER_REPLICA_ID", "runner-a")],
    "RUNNER_PEER_TOKEN_FILE is set but peers cannot reach this replica: set RUNNER_REPLICA_URL (or POD_IP from the downward API)."
)]
#[case::bad_name(
    &[("RUNNER_REPLICA_ID", "Runner_A"), ("POD_IP", "10.0.0.7")],
    "RUNNER_REPLICA_ID must be a DNS label (lowercase letters, digits and dashes, at most 50 characters, starting and ending with a letter or digit), got 'Runner_A'."
)]
#[case::url_with_a_path(
    &[("RUNNER_REPLICA_ID", "runner-a"), ("RUNNER_REPLICA_URL", "http://10.0.0.7:8062/api")],
    "RUNNER_REPLICA_URL must be an absolute http(s) URL with no path (http://10.0.0.7:8062), got 'http://10.0.0.7:8062/api'."
)]
#[case::short_lease(
    &[("RUNNER_REPLICA_ID", "runner-a"), ("POD_IP", "10.0.0.7"), ("RUNNER_LEASE_DURATION_SECONDS", "2")],
    "RUNNER_LEASE_DURATION_SECONDS must be a whole number of seconds from 3, got '2'."
)]
fn a_replica_that_cannot_be_one_is_refused(#[case] pairs: &[(&str, &str)], #[case] message: &str) {
    let (_dir, path) = token_file(&"s".repeat(40));
    let mut all = vec![("RUNNER_PEER_TOKEN_FILE", path.as_str())];
    all.extend_from_slice(pairs);
    assert_eq!(error(&all), message);
}

#[test]
fn a_short_peer_token_is_refused() {
    let (_dir, path) = token_file("short\n");
    assert_eq!(
        error(&[
            ("RUNNER_PEER_TOKEN_FILE", path.as_str()),
            ("RUNNER_REPLICA_ID", "runner-a"),
            ("POD_IP", "10.0.0.7"),
        ]),
        format!(
            "RUNNER_PEER_TOKEN_FILE must be a file holding a secret of at least 32 bytes ('{path}' holds 5)."
        )
    );
}
