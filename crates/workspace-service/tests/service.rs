//! The service and its client against each other: a real server on
//! `127.0.0.1:0` over a temporary directory, the real client.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use runner_api::types::BundleFile;
use runner_api::watch::{FileEncoding, WorkspaceChangeSet, WorkspaceWrite};
use runner_core::WorkspaceFailure;
use runner_workspace::WorkspaceLimits;
use runner_workspace_service::client::{CheckpointFetchError, WorkspaceClient};
use runner_workspace_service::{Config, body_cap, serve_on};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "a-session-token-of-at-least-32-characters";
/// Every wait in these tests is bounded by this.
const BOUND: Duration = Duration::from_secs(20);

struct Served {
    addr: SocketAddr,
    root: PathBuf,
    client: WorkspaceClient,
    http: reqwest::Client,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(limits: WorkspaceLimits) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("workspace");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = Config {
            dir: root.clone(),
            listen: addr,
            token: TOKEN.to_owned(),
            limits,
            exit_after_write: None,
            connections: runner_workspace_service::connection_limits(),
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { serve_on(listener, config, shutdown).await.unwrap() }
        });
        let http = runner_core::http_client::client();
        let client = WorkspaceClient::new(http.clone(), addr, TOKEN.to_owned());
        let served = Served {
            addr,
            root,
            client,
            http,
            shutdown,
            task,
            _dir: dir,
        };
        tokio::time::timeout(BOUND, async {
            while !served.client.health().await {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the service answers /v1/health");
        served
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A raw request, for what the client never sends.
    async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = tokio::time::timeout(BOUND, request.send())
            .await
            .unwrap()
            .unwrap();
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (status, value)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(BOUND, self.task)
            .await
            .expect("the service stops when asked")
            .unwrap();
    }
}

fn bundle(files: &[(&str, &str)]) -> Vec<BundleFile> {
    files
        .iter()
        .map(|(path, contents)| BundleFile {
            relative_path: (*path).to_owned(),
            contents: (*contents).to_owned(),
        })
        .collect()
}

fn write(path: &str, content: &str) -> WorkspaceWrite {
    WorkspaceWrite {
        path: path.to_owned(),
        content: content.to_owned(),
        encoding: None,
    }
}

async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future)
        .await
        .expect("answered in time")
}

fn paths(tree: &runner_api::watch::WorkspaceTree) -> Vec<&str> {
    tree.files.iter().map(|file| file.path.as_str()).collect()
}

fn assert_failure(failure: WorkspaceFailure, status: u16, code: &str, message_has: &str) {
    let wire = runner_core::http::ErrorCode::from(failure.cause);
    assert_eq!(
        (wire.status().as_u16(), wire.as_str()),
        (status, code),
        "{}",
        failure.message
    );
    assert!(
        failure.message.contains(message_has),
        "'{}' does not say '{message_has}'",
        failure.message
    );
}

#[tokio::test]
async fn every_route_round_trips_through_the_client() {
    let served = Served::start(WorkspaceLimits::default()).await;
    let client = &served.client;

    let seeded = bounded(client.seed(&bundle(&[
        ("telo.yaml", "kind: Telo.Application\n"),
        ("lib/a.yaml", "a: 1\n"),
    ])))
    .await
    .unwrap();
    assert_eq!(
        (seeded.written, seeded.deleted),
        (3, 0),
        "two files and the marker"
    );

    let tree = bounded(client.tree()).await.unwrap();
    assert_eq!(
        paths(&tree),
        ["lib/a.yaml", "telo-workspace.yaml", "telo.yaml"]
    );

    let file = bounded(client.read_file("telo.yaml")).await.unwrap();
    assert_eq!(file.content, "kind: Telo.Application\n");
    assert_eq!(file.size, 23);

    let applied = bounded(client.apply(&WorkspaceChangeSet {
        write: vec![
            write("lib/b.yaml", "b: 2\n"),
            WorkspaceWrite {
                path: "bin/raw".into(),
                content: STANDARD.encode([0u8, 159, 146, 150]),
                encoding: Some(FileEncoding::Base64),
            },
        ],
        delete: vec!["lib/a.yaml".into(), "nothing-here".into()],
    }))
    .await
    .unwrap();
    assert_eq!((applied.written, applied.deleted), (2, 1));
    assert_eq!(
        std::fs::read(served.root.join("bin/raw")).unwrap(),
        [0u8, 159, 146, 150]
    );
    assert!(!served.root.join("lib/a.yaml").exists());

    let before = std::fs::metadata(served.root.join("lib/b.yaml")).unwrap();
    bounded(client.touch("lib/b.yaml")).await.unwrap();
    let after = std::fs::metadata(served.root.join("lib/b.yaml")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_ne!(before.ino(), after.ino(), "a touch writes a new inode");
    assert_eq!(
        std::fs::read_to_string(served.root.join("lib/b.yaml")).unwrap(),
        "b: 2\n"
    );

    let tree = bounded(client.tree()).await.unwrap();
    let snapshot = bounded(client.snapshot()).await.unwrap();
    assert_eq!(
        snapshot
            .iter()
            .map(|file| (file.path.as_str(), file.hash.as_str()))
            .collect::<Vec<_>>(),
        tree.files
            .iter()
            .map(|file| (file.path.as_str(), file.hash.as_str()))
            .collect::<Vec<_>>()
    );

    // Resume: the checkpoint into a fresh, empty workspace.
    let fresh = Served::start(WorkspaceLimits::default()).await;
    bounded(fresh.client.restore(&snapshot)).await.unwrap();
    assert_eq!(bounded(fresh.client.tree()).await.unwrap(), tree);
    assert_eq!(
        std::fs::read(fresh.root.join("bin/raw")).unwrap(),
        [0u8, 159, 146, 150]
    );

    let (status, body) = served
        .raw(reqwest::Method::GET, "/v1/health", None, None)
        .await;
    assert_eq!((status, body), (200, json!({"ok": true})));
    fresh.stop().await;
    served.stop().await;
}

/// A checkpoint is made beside the files, in the form the runner stores,
/// and its size is known from its length before any of it is read: a
/// workspace too large to store costs the runner nothing.
#[tokio::test]
async fn a_checkpoint_is_the_compressed_snapshot_and_its_size_comes_first() {
    let served = Served::start(WorkspaceLimits::default()).await;
    std::fs::write(served.root.join("a.txt"), "a".repeat(10_000)).unwrap();
    std::fs::write(served.root.join("b.bin"), [0u8, 159, 146, 150]).unwrap();
    let client = &served.client;
    let stored = bounded(client.checkpoint(1 << 20)).await.unwrap();
    assert!(stored.len() < 1000, "{}", stored.len());
    let files = runner_workspace::checkpoint::decode(&stored, 1 << 24).unwrap();
    assert_eq!(files, bounded(client.snapshot()).await.unwrap());
    match bounded(client.checkpoint(10)).await {
        Err(CheckpointFetchError::TooLarge { bytes }) => assert_eq!(bytes, stored.len() as u64),
        other => panic!("{other:?}"),
    }
    let (status, answer) = served
        .raw(reqwest::Method::GET, "/v1/checkpoint", None, None)
        .await;
    assert_eq!((status, &answer["error"]), (401, &json!("unauthorized")));
    served.stop().await;
}

#[tokio::test]
async fn every_authenticated_route_refuses_a_missing_or_wrong_token() {
    let served = Served::start(WorkspaceLimits::default()).await;
    std::fs::write(served.root.join("a.txt"), "a").unwrap();
    let empty_files = Some(br#"{"files":[]}"#.to_vec());
    let routes: Vec<(reqwest::Method, &str, Option<Vec<u8>>)> = vec![
        (reqwest::Method::GET, "/v1/tree", None),
        (reqwest::Method::GET, "/v1/file?path=a.txt", None),
        (reqwest::Method::POST, "/v1/apply", Some(b"{}".to_vec())),
        (reqwest::Method::POST, "/v1/touch?path=a.txt", None),
        (reqwest::Method::POST, "/v1/seed", empty_files.clone()),
        (reqwest::Method::GET, "/v1/snapshot", None),
        (reqwest::Method::POST, "/v1/restore", empty_files),
    ];
    let wrong = "b-session-token-of-at-least-32-characters";
    for (method, path, body) in routes {
        for token in [None, Some(wrong), Some("")] {
            let (status, answer) = served.raw(method.clone(), path, token, body.clone()).await;
            assert_eq!(status, 401, "{method} {path} with {token:?}");
            assert_eq!(answer["error"], "unauthorized", "{method} {path}");
            assert!(answer["message"].is_string());
        }
        let (status, _) = served.raw(method.clone(), path, Some(TOKEN), body).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path} with the token: {status}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(served.root.join("a.txt")).unwrap(),
        "a"
    );

    // The runner's client with the wrong token: a 500, not the editor's 401.
    let client = WorkspaceClient::new(
        runner_core::http_client::client(),
        served.addr,
        wrong.to_owned(),
    );
    let failure = bounded(client.tree()).await.unwrap_err();
    assert_failure(failure, 500, "workspace_failed", "401 unauthorized");
    served.stop().await;
}

#[tokio::test]
async fn errors_keep_their_status_and_code() {
    let limits = WorkspaceLimits {
        max_file_bytes: 16,
        ..WorkspaceLimits::default()
    };
    let served = Served::start(limits).await;
    let client = &served.client;
    std::fs::write(served.root.join("big.txt"), [b'x'; 32]).unwrap();
    std::fs::create_dir(served.root.join("dir")).unwrap();

    let cases = [
        (
            "../outside",
            400,
            "invalid_path",
            "invalid bundle relativePath '../outside'",
        ),
        // A leading `/` is relative to the root, as in a bundle.
        (
            "/etc/passwd",
            404,
            "file_not_found",
            "no file '/etc/passwd'",
        ),
        (
            "missing.txt",
            404,
            "file_not_found",
            "no file 'missing.txt'",
        ),
        ("dir", 400, "not_a_file", "'dir' is not a regular file"),
        (
            "big.txt",
            413,
            "workspace_too_large",
            "RUNNER_WORKSPACE_MAX_FILE_BYTES",
        ),
    ];
    for (path, status, code, says) in cases {
        let failure = bounded(client.read_file(path)).await.unwrap_err();
        assert_failure(failure, status, code, says);
    }
    let failure = bounded(client.touch("big.txt")).await.unwrap_err();
    assert_failure(failure, 413, "workspace_too_large", "limit of 16 per file");
    let failure = bounded(client.apply(&WorkspaceChangeSet {
        write: vec![write("new.txt", "more than sixteen bytes")],
        delete: vec![],
    }))
    .await
    .unwrap_err();
    assert_failure(
        failure,
        413,
        "workspace_too_large",
        "RUNNER_WORKSPACE_MAX_FILE_BYTES",
    );
    assert!(
        !served.root.join("new.txt").exists(),
        "a refused change set writes nothing"
    );
    let failure = bounded(client.apply(&WorkspaceChangeSet {
        write: vec![WorkspaceWrite {
            path: "x.bin".into(),
            content: "not base64!".into(),
            encoding: Some(FileEncoding::Base64),
        }],
        delete: vec![],
    }))
    .await
    .unwrap_err();
    assert_failure(failure, 400, "invalid_encoding", "'x.bin'");
    let failure = bounded(client.apply(&WorkspaceChangeSet {
        write: vec![write("big.txt/under", "x")],
        delete: vec![],
    }))
    .await
    .unwrap_err();
    assert_failure(failure, 409, "path_conflict", "'big.txt/under'");
    let failure = bounded(client.seed(&bundle(&[("../up.yaml", "x")])))
        .await
        .unwrap_err();
    assert_failure(failure, 400, "invalid_path", "'../up.yaml'");

    // What only a raw request can send.
    let (status, body) = served
        .raw(reqwest::Method::GET, "/v1/file", Some(TOKEN), None)
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request"))
    );
    assert_eq!(
        body["message"],
        "the query needs ?path=<a file of the workspace>"
    );
    let (status, body) = served
        .raw(
            reqwest::Method::POST,
            "/v1/apply",
            Some(TOKEN),
            Some(b"{\"write\": 3".to_vec()),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_json"))
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("the body is not the JSON this route takes: ")
    );
    let (status, body) = served
        .raw(reqwest::Method::GET, "/v1/nothing", Some(TOKEN), None)
        .await;
    assert_eq!(
        (status, body),
        (
            404,
            json!({"error": "not_found", "message": "no route GET /v1/nothing"})
        )
    );
    let (status, body) = served
        .raw(reqwest::Method::DELETE, "/v1/tree", Some(TOKEN), None)
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (405, Some("method_not_allowed"))
    );
    served.stop().await;
}

#[tokio::test]
async fn a_body_over_the_cap_is_refused_naming_the_limit() {
    let limits = WorkspaceLimits {
        max_change_set_bytes: 3 * 1024,
        max_workspace_bytes: 6 * 1024,
        ..WorkspaceLimits::default()
    };
    let served = Served::start(limits).await;
    let apply_cap = body_cap(3 * 1024);
    assert_eq!(apply_cap, 4 * 1024 + 1024 * 1024);
    let workspace_cap = body_cap(6 * 1024);

    // A declared length over the cap, and a streamed body that grows past
    // it.
    let over = vec![b' '; usize::try_from(apply_cap).unwrap() + 1];
    let (status, body) = served
        .raw(reqwest::Method::POST, "/v1/apply", Some(TOKEN), Some(over))
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("workspace_too_large"))
    );
    assert_eq!(
        body["message"],
        format!(
            "the request body is over this service's limit of {apply_cap} bytes (which follows RUNNER_WORKSPACE_MAX_CHANGE_BYTES)"
        )
    );
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..17).map(|_| Ok(vec![b' '; 64 * 1024])).collect();
    let streamed = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let response = bounded(
        served
            .http
            .post(served.url("/v1/restore"))
            .bearer_auth(TOKEN)
            .body(streamed)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["message"],
        format!(
            "the request body is over this service's limit of {workspace_cap} bytes (which follows RUNNER_WORKSPACE_MAX_BYTES)"
        )
    );

    // Within the body cap but over the decoded change-set cap: the
    // workspace's own refusal.
    let failure = bounded(served.client.apply(&WorkspaceChangeSet {
        write: vec![write("a.txt", &"a".repeat(4 * 1024))],
        delete: vec![],
    }))
    .await
    .unwrap_err();
    assert_failure(
        failure,
        413,
        "workspace_too_large",
        "RUNNER_WORKSPACE_MAX_CHANGE_BYTES",
    );
    // And a restore past the workspace cap.
    let big = STANDARD.encode(vec![7u8; 7 * 1024]);
    let failure = bounded(
        served
            .client
            .restore(&[runner_api::watch::WorkspaceCheckpointFile {
                path: "big.bin".into(),
                hash: String::new(),
                content: big,
                encoding: FileEncoding::Base64,
            }]),
    )
    .await
    .unwrap_err();
    assert_failure(
        failure,
        413,
        "workspace_too_large",
        "RUNNER_WORKSPACE_MAX_BYTES",
    );
    assert!(!served.root.join("big.bin").exists());
    served.stop().await;
}

#[tokio::test]
async fn links_and_fifos_the_workload_planted_are_never_followed() {
    let served = Served::start(WorkspaceLimits::default()).await;
    let client = &served.client;
    bounded(client.seed(&bundle(&[("telo.yaml", "kind: x\n")])))
        .await
        .unwrap();
    std::os::unix::fs::symlink("/etc/passwd", served.root.join("passwd")).unwrap();
    std::os::unix::fs::symlink("/etc", served.root.join("etc")).unwrap();
    nix::unistd::mkfifo(
        &served.root.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();

    let tree = bounded(client.tree()).await.unwrap();
    assert_eq!(paths(&tree), ["telo-workspace.yaml", "telo.yaml"]);
    let snapshot = bounded(client.snapshot()).await.unwrap();
    assert_eq!(snapshot.len(), 2);
    assert!(snapshot.iter().all(|file| !file.path.contains("passwd")));

    for path in ["passwd", "etc/passwd"] {
        let failure = bounded(client.read_file(path)).await.unwrap_err();
        assert_failure(failure, 400, "invalid_path", "symbolic link");
        let failure = bounded(client.touch(path)).await.unwrap_err();
        assert_failure(failure, 400, "invalid_path", "symbolic link");
    }
    // A FIFO is never opened, so nothing blocks on it.
    let failure = bounded(client.read_file("pipe")).await.unwrap_err();
    assert_failure(failure, 400, "not_a_file", "'pipe'");
    let failure = bounded(client.touch("pipe")).await.unwrap_err();
    assert_failure(failure, 400, "not_a_file", "'pipe'");
    assert!(bounded(client.health()).await);
    served.stop().await;
}

#[tokio::test]
async fn a_service_that_does_not_answer_is_unavailable() {
    // A port that was just free: nothing listens there.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = WorkspaceClient::new(runner_core::http_client::client(), addr, TOKEN.to_owned());
    assert!(!bounded(client.health()).await);
    let failure = bounded(client.tree()).await.unwrap_err();
    assert_failure(
        failure,
        500,
        "workspace_failed",
        "the session's workspace did not answer: ",
    );
}

#[tokio::test]
async fn a_relative_or_unusable_directory_is_a_serve_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = Config {
        dir: file.clone(),
        listen: listener.local_addr().unwrap(),
        token: TOKEN.to_owned(),
        limits: WorkspaceLimits::default(),
        exit_after_write: None,
        connections: runner_workspace_service::connection_limits(),
    };
    let err = bounded(serve_on(listener, config, CancellationToken::new()))
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "could not open the workspace directory {}",
            file.display()
        )),
        "{err}"
    );
}

/// With `exit_after_write`, the service answers the change set that wrote
/// that path and then stops serving (a warm pod's service, once its
/// session is launched).
#[tokio::test]
async fn the_service_exits_after_writing_its_exit_file() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = Config {
        dir: dir.path().join("app"),
        listen: addr,
        token: TOKEN.to_owned(),
        limits: WorkspaceLimits::default(),
        exit_after_write: Some(".launch".to_owned()),
        connections: runner_workspace_service::connection_limits(),
    };
    let served = tokio::spawn(serve_on(listener, config, CancellationToken::new()));
    let client = WorkspaceClient::new(runner_core::http_client::client(), addr, TOKEN.to_owned());
    let write = |path: &str| WorkspaceChangeSet {
        write: vec![WorkspaceWrite {
            path: path.to_owned(),
            content: "x".to_owned(),
            encoding: None,
        }],
        delete: Vec::new(),
    };
    // The listener is bound: this waits for the service to serve.
    client.apply(&write("app.yaml")).await.unwrap();
    assert!(!served.is_finished(), "still serving");
    client.apply(&write("./.launch")).await.unwrap();
    bounded(served).await.unwrap().unwrap();
    assert!(dir.path().join("app/.launch").is_file());
}
