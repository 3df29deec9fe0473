use runner_api::telo::TeloRefusal;
use runner_api::types::{BundleFile, PullPolicy, RequestedConfig};

use super::*;
use crate::apps::AppEntry;

/// A backend that runs what it is told to.
struct Checks {
    versions: bool,
    supply: Result<(), TeloUnavailable>,
    images: Vec<String>,
}

impl Default for Checks {
    fn default() -> Self {
        Self {
            versions: true,
            supply: Ok(()),
            images: vec!["base:1".to_owned()],
        }
    }
}

impl BackendChecks for Checks {
    fn offers_telo_versions(&self) -> bool {
        self.versions
    }

    fn supply_telo(
        &self,
        _version: &TeloVersion,
        _mode: SessionMode,
    ) -> Result<(), TeloUnavailable> {
        self.supply.clone()
    }

    fn validate_config(&self, config: &SessionConfig) -> Result<(), InvalidSessionConfig> {
        if self.images.contains(&config.image) {
            Ok(())
        } else {
            Err(InvalidSessionConfig::ImageNotOffered {
                image: config.image.clone(),
                offered: self.images.clone(),
            })
        }
    }
}

fn entry(port: Option<u16>, token_env: Option<&str>) -> AppEntry {
    AppEntry {
        image: "agent:1".to_owned(),
        env: vec![("OPERATOR".to_owned(), "1".to_owned())],
        pull_policy: PullPolicy::Missing,
        title: None,
        description: None,
        command: None,
        accept_env: Some(vec!["ALLOWED".to_owned()]),
        token_env: token_env.map(str::to_owned),
        port,
    }
}

fn catalog() -> AppCatalog {
    AppCatalog::from_entries(vec![
        ("agent".to_owned(), entry(Some(7070), Some("AGENT_TOKEN"))),
        ("portless".to_owned(), entry(None, None)),
    ])
}

fn offer<'a>(checks: &'a Checks, catalog: &'a AppCatalog) -> Offer<'a> {
    Offer {
        backend: checks,
        default_config: SessionConfig {
            image: "base:1".to_owned(),
            pull_policy: PullPolicy::Missing,
            registry_url: None,
        },
        io_modes: vec!["tty".to_owned(), "streams".to_owned()],
        watch: true,
        catalog,
        backend_runs_agents: true,
        offered_agents: vec!["agent".to_owned(), "portless".to_owned()],
        live_watch_sessions: 0,
        max_watch_sessions: 2,
        default_registry_url: Some("https://registry.example".to_owned()),
    }
}

fn request() -> StartSessionBody {
    StartSessionBody {
        bundle: RunBundle {
            entry_relative_path: "telo.yaml".to_owned(),
            files: vec![BundleFile {
                relative_path: "telo.yaml".to_owned(),
                contents: "kind: Telo.Application\n".to_owned(),
            }],
        },
        env: Vec::new(),
        ports: Vec::new(),
        config: RequestedConfig::default(),
        inspect: false,
        mode: SessionMode::Run,
        agent: None,
        apps: None,
        telo: None,
    }
}

fn watch() -> StartSessionBody {
    StartSessionBody {
        mode: SessionMode::Watch,
        ..request()
    }
}

fn tcp(port: u16) -> PortMapping {
    PortMapping {
        port,
        protocol: PortProtocol::Tcp,
    }
}

fn app(name: &str, ports: Vec<PortMapping>, io: IoMode, telo: Option<&str>) -> AppSpec {
    AppSpec {
        name: name.to_owned(),
        entry_relative_path: "telo.yaml".to_owned(),
        ports,
        io,
        telo: telo.map(str::to_owned),
    }
}

/// One setting away from what [`offer`] and [`request`] make.
struct Setup {
    versions: bool,
    supply: Option<TeloUnavailable>,
    watch: bool,
    runs_agents: bool,
    io_modes: &'static [&'static str],
    live_watch_sessions: usize,
    request: fn(&mut StartSessionBody),
}

const BASE: Setup = Setup {
    versions: true,
    supply: None,
    watch: true,
    runs_agents: true,
    io_modes: &["tty", "streams"],
    live_watch_sessions: 0,
    request: |_| {},
};

/// Every refusal of `POST /v1/sessions`, one setting away from a request
/// that is admitted; the expected text is the message a client reads.
const REFUSALS: &[(&str, Setup, &str)] = &[
    (
        "a version on a runner that runs no chosen version",
        Setup {
            versions: false,
            request: |request| request.telo = Some("0.81.0".to_owned()),
            ..BASE
        },
        "this runner does not run a chosen telo version (its /v1/capabilities has no features.teloVersions) \u{2014} leave `telo` out to run the kernel it provides",
    ),
    (
        "a version the backend cannot supply",
        Setup {
            supply: Some(TeloUnavailable::OnlyConfiguredKernel),
            request: |request| request.telo = Some("0.81.0".to_owned()),
            ..BASE
        },
        "telo 0.81.0 cannot be run for app 'app': this runner runs only the Telo CLI it was configured with",
    ),
    (
        "a config key the version supersedes",
        Setup {
            request: |request| {
                request.telo = Some("0.81.0".to_owned());
                request.config.image = Some("base:1".to_owned());
            },
            ..BASE
        },
        "SUPERSEDED",
    ),
    (
        "an image the backend does not offer",
        Setup {
            request: |request| request.config.image = Some("other:2".to_owned()),
            ..BASE
        },
        "base image 'other:2' is not offered by this runner. Allowed images: base:1",
    ),
    (
        "a watch session on a runner without them",
        Setup {
            watch: false,
            request: |request| request.mode = SessionMode::Watch,
            ..BASE
        },
        "this runner does not offer watch sessions (see /v1/capabilities)",
    ),
    (
        "an agent on a run session",
        Setup {
            request: |request| request.agent = Some("agent".to_owned()),
            ..BASE
        },
        "`agent` requires `mode: \"watch\"` \u{2014} nothing would observe the agent's writes",
    ),
    (
        "an agent the catalog does not hold",
        Setup {
            request: |request| {
                request.mode = SessionMode::Watch;
                request.agent = Some("nope".to_owned());
            },
            ..BASE
        },
        "agent 'nope' is not offered by this runner \u{2014} offered: agent, portless",
    ),
    (
        "an agent on a backend that runs none",
        Setup {
            runs_agents: false,
            request: |request| {
                request.mode = SessionMode::Watch;
                request.agent = Some("agent".to_owned());
            },
            ..BASE
        },
        "agent 'agent' is not offered by this runner",
    ),
    (
        "an agent without a port",
        Setup {
            request: |request| {
                request.mode = SessionMode::Watch;
                request.agent = Some("portless".to_owned());
            },
            ..BASE
        },
        "agent 'portless' declares no port, so this runner cannot route it \u{2014} set RUNNER_APPS.portless.port to the port its image listens on",
    ),
    (
        "a watch session past the limit",
        Setup {
            live_watch_sessions: 2,
            request: |request| request.mode = SessionMode::Watch,
            ..BASE
        },
        "runner is at its configured max of 2 concurrent watch sessions",
    ),
    (
        "an io the backend does not offer",
        Setup {
            io_modes: &["tty"],
            request: |request| {
                request.mode = SessionMode::Watch;
                request.apps = Some(vec![app("api", vec![], IoMode::Streams, None)]);
            },
            ..BASE
        },
        "app 'api' asks for io 'streams', which this runner does not offer; it offers: tty",
    ),
    (
        "streams on a run session",
        Setup {
            request: |request| {
                request.apps = Some(vec![app("api", vec![], IoMode::Streams, None)]);
            },
            ..BASE
        },
        "app 'api' asks for io 'streams', which this runner offers to watch sessions only (`mode: \"watch\"`); a run session runs on a terminal (io 'tty')",
    ),
];

#[test]
fn each_refusal_of_a_session_is_its_own_and_says_why() {
    let catalog = catalog();
    {
        let checks = Checks::default();
        admit_session(&offer(&checks, &catalog), request(), "telo.yaml".to_owned())
            .expect("the base run request is admitted");
        admit_session(&offer(&checks, &catalog), watch(), "telo.yaml".to_owned())
            .expect("the base watch request is admitted");
    }
    for (name, setup, message) in REFUSALS {
        let checks = Checks {
            versions: setup.versions,
            supply: setup.supply.clone().map_or(Ok(()), Err),
            ..Checks::default()
        };
        let mut offer = offer(&checks, &catalog);
        offer.watch = setup.watch;
        offer.backend_runs_agents = setup.runs_agents;
        if !setup.runs_agents {
            offer.offered_agents.clear();
        }
        offer.io_modes = setup
            .io_modes
            .iter()
            .map(|mode| (*mode).to_owned())
            .collect();
        offer.live_watch_sessions = setup.live_watch_sessions;
        let mut request = request();
        (setup.request)(&mut request);
        let refusal = admit_session(&offer, request, "telo.yaml".to_owned()).expect_err(name);
        let expected = match *message {
            "SUPERSEDED" => superseded_config_message("image"),
            message => message.to_owned(),
        };
        assert_eq!(refusal.to_string(), expected, "{name}");
    }
}

#[test]
fn a_version_text_that_is_no_version_is_refused_as_invalid() {
    let (checks, catalog) = (Checks::default(), catalog());
    let request = StartSessionBody {
        telo: Some("latest".to_owned()),
        ..request()
    };
    let refusal = admit_session(&offer(&checks, &catalog), request, "telo.yaml".to_owned())
        .expect_err("refused");
    assert!(
        matches!(refusal, Refusal::Telo(TeloRefusal::Invalid { .. })),
        "{refusal:?}"
    );
}

#[test]
fn an_app_set_that_breaks_the_app_rules_is_refused_with_the_rules_code() {
    let (checks, catalog) = (Checks::default(), catalog());
    let request = StartSessionBody {
        apps: Some(vec![
            app("api", vec![], IoMode::Tty, None),
            app("api", vec![], IoMode::Tty, None),
        ]),
        ..watch()
    };
    let refusal = admit_session(&offer(&checks, &catalog), request, "telo.yaml".to_owned())
        .expect_err("refused");
    assert!(
        matches!(&refusal, Refusal::Apps(apps) if apps.code == "duplicate_app_name"),
        "{refusal:?}"
    );
}

#[test]
fn the_checks_run_in_order_and_the_first_refusal_wins() {
    // An agent on a run session that also asks for an image the backend
    // does not offer: the config is checked first.
    let (checks, catalog) = (Checks::default(), catalog());
    let request = StartSessionBody {
        agent: Some("agent".to_owned()),
        config: RequestedConfig {
            image: Some("other:2".to_owned()),
            ..RequestedConfig::default()
        },
        ..request()
    };
    let refusal = admit_session(&offer(&checks, &catalog), request, "telo.yaml".to_owned())
        .expect_err("refused");
    assert!(matches!(refusal, Refusal::InvalidConfig(_)), "{refusal:?}");
}

#[test]
fn a_run_session_runs_its_first_app_with_the_registry_url() {
    let (checks, catalog) = (Checks::default(), catalog());
    let request = StartSessionBody {
        telo: Some("0.81.0".to_owned()),
        ports: vec![tcp(8080)],
        ..request()
    };
    let Admitted::Run(plan) =
        admit_session(&offer(&checks, &catalog), request, "telo.yaml".to_owned()).unwrap()
    else {
        panic!("a run session");
    };
    assert_eq!(plan.name, DEFAULT_APP_NAME);
    assert_eq!(plan.ports, vec![tcp(8080)]);
    assert_eq!(plan.telo.as_deref(), Some("0.81.0"));
    assert_eq!(
        plan.env,
        vec![(
            "TELO_REGISTRY_URL".to_owned(),
            "https://registry.example".to_owned()
        )]
    );
}

#[test]
fn the_manifest_wins_a_port_clash_with_the_agent() {
    let (checks, catalog) = (Checks::default(), catalog());
    let clash = StartSessionBody {
        agent: Some("agent".to_owned()),
        apps: Some(vec![app("api", vec![tcp(7070)], IoMode::Tty, None)]),
        ..watch()
    };
    let Admitted::Watch(plan) =
        admit_session(&offer(&checks, &catalog), clash, "telo.yaml".to_owned()).unwrap()
    else {
        panic!("a watch session");
    };
    assert_eq!(plan.agent, None);
    assert_eq!(
        plan.agent_notice.as_deref(),
        Some(
            "co-resident agent 'agent' was not started: it listens on tcp port 7070, which app 'api' declares"
        )
    );

    let apart = StartSessionBody {
        agent: Some("agent".to_owned()),
        ..watch()
    };
    let Admitted::Watch(plan) =
        admit_session(&offer(&checks, &catalog), apart, "telo.yaml".to_owned()).unwrap()
    else {
        panic!("a watch session");
    };
    let agent = plan.agent.expect("the agent runs");
    assert_eq!((agent.name.as_str(), agent.port), ("agent", 7070));
    assert!(agent.token.is_some(), "its entry has tokenEnv");
    assert_eq!(plan.agent_notice, None);
}

#[test]
fn a_new_app_set_may_not_take_the_agents_port() {
    let (checks, catalog) = (Checks::default(), catalog());
    let agent = AgentRef {
        name: "agent".to_owned(),
        port: 7070,
        token: None,
    };
    let refusal = admit_app_set(
        &offer(&checks, &catalog),
        vec![app("api", vec![tcp(7070)], IoMode::Tty, None)],
        Some(&agent),
    )
    .expect_err("refused");
    assert_eq!(
        refusal.to_string(),
        "app 'api' declares tcp port 7070, which this session's co-resident agent 'agent' listens on"
    );
    let apps = admit_app_set(
        &offer(&checks, &catalog),
        vec![app("api", vec![tcp(8080)], IoMode::Streams, Some("0.95.0"))],
        Some(&agent),
    )
    .expect("admitted");
    assert_eq!(apps[0].telo.as_deref(), Some("0.95.0"));
}

#[test]
fn a_new_app_set_is_held_to_the_version_and_io_rules() {
    let catalog = catalog();
    let checks = Checks {
        supply: Err(TeloUnavailable::NotOffered),
        ..Checks::default()
    };
    let refusal = admit_app_set(
        &offer(&checks, &catalog),
        vec![app("api", vec![], IoMode::Tty, Some("0.81.0"))],
        None,
    )
    .expect_err("refused");
    assert!(
        matches!(refusal, Refusal::Telo(TeloRefusal::Unavailable { .. })),
        "{refusal:?}"
    );
    let checks = Checks::default();
    let mut tty_only = offer(&checks, &catalog);
    tty_only.io_modes = vec!["tty".to_owned()];
    let refusal = admit_app_set(
        &tty_only,
        vec![app("api", vec![], IoMode::Streams, None)],
        None,
    )
    .expect_err("refused");
    assert!(
        matches!(refusal, Refusal::IoNotOffered { .. }),
        "{refusal:?}"
    );
}

#[test]
fn a_catalog_app_session_is_refused_for_an_unknown_app_or_variable() {
    let catalog = catalog();
    let body = |env: Vec<(&str, &str)>| AppSessionBody {
        env: env
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        ports: Vec::new(),
        inspect: false,
    };
    let refusal = admit_app_session(&catalog, None, "nope", body(vec![])).expect_err("refused");
    assert_eq!(
        refusal.to_string(),
        "app 'nope' is not offered by this runner \u{2014} offered apps: agent, portless (see /v1/capabilities)."
    );
    let refusal = admit_app_session(&catalog, None, "agent", body(vec![("OTHER", "1")]))
        .expect_err("refused");
    assert!(matches!(refusal, Refusal::ClientEnv(_)), "{refusal:?}");

    let plan = admit_app_session(
        &catalog,
        Some("https://registry.example".to_owned()),
        "agent",
        body(vec![("ALLOWED", "1")]),
    )
    .expect("admitted");
    let token = plan.launch.token.clone().expect("a token is minted");
    assert_eq!(
        plan.env,
        vec![
            ("ALLOWED".to_owned(), "1".to_owned()),
            ("OPERATOR".to_owned(), "1".to_owned()),
            ("AGENT_TOKEN".to_owned(), token),
            (
                "TELO_REGISTRY_URL".to_owned(),
                "https://registry.example".to_owned()
            ),
        ]
    );
}

#[test]
fn a_bundle_path_that_breaks_the_rules_is_refused() {
    let mut bundle = request().bundle;
    assert_eq!(bundle_entry(&bundle).as_deref(), Ok("telo.yaml"));
    bundle.files.push(BundleFile {
        relative_path: "../escape.yaml".to_owned(),
        contents: String::new(),
    });
    assert!(matches!(
        bundle_entry(&bundle),
        Err(Refusal::InvalidBundle(_))
    ));
}

#[test]
fn the_registry_url_is_added_only_when_the_env_does_not_name_it() {
    let env = with_registry_url(vec![], Some("https://r".into()));
    assert_eq!(env, vec![("TELO_REGISTRY_URL".into(), "https://r".into())]);
    let env = with_registry_url(
        vec![("TELO_REGISTRY_URL".into(), String::new())],
        Some("https://r".into()),
    );
    assert_eq!(env, vec![("TELO_REGISTRY_URL".into(), String::new())]);
    assert!(with_registry_url(vec![], None).is_empty());
}
