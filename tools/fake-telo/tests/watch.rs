//! `run --watch`: generations, change detection, the per-generation debug
//! frames. Every wait is on output or a frame (with the harness's deadline).

mod support;

use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};
use support::{ENTRY_FILE, FakeTelo, OUTPUT_TIMEOUT, http_get, launch, next_frame, open_events};

const WATCH: &[&str] = &["run", "--watch", ENTRY_FILE];
const WATCH_INSPECT: &[&str] = &["run", "--watch", "--inspect", "127.0.0.1:0", ENTRY_FILE];

fn entry_path(fake: &FakeTelo) -> PathBuf {
    fake.dir()
        .canonicalize()
        .expect("canonical dir")
        .join(ENTRY_FILE)
}

fn write_entry(fake: &FakeTelo, manifest: &str) {
    std::fs::write(fake.dir().join(ENTRY_FILE), manifest).expect("write the entry");
}

/// The lines a reload prints before the next generation's output (one that loads).
fn expect_reload_of(fake: &mut FakeTelo, path: &std::path::Path) {
    assert_eq!(
        fake.next_line(),
        format!("[watch] change detected in {}", path.display())
    );
    assert_eq!(fake.next_line(), "[watch] reloading...");
    let watching = fake.next_line();
    assert!(watching.starts_with("[watch] watching "), "{watching}");
}

/// Reads frames until an event named `name` and returns it, with the names
/// of the events read on the way (`name` last).
fn events_until(reader: &mut BufReader<TcpStream>, name: &str) -> (Vec<String>, Value) {
    let mut names = Vec::new();
    loop {
        let frame = next_frame(reader);
        if frame["kind"] != "event" {
            continue;
        }
        let event = frame["event"].as_str().expect("event name").to_owned();
        names.push(event.clone());
        if event == name {
            return (names, frame);
        }
    }
}

#[test]
fn an_edit_of_the_entry_starts_generation_two_with_the_new_stdout() {
    let mut fake = launch("fakeTelo: { stdout: [generation one] }\n")
        .args(WATCH)
        .spawn();
    assert_eq!(fake.next_line(), "[watch] watching 1 file(s)");
    assert_eq!(fake.next_line(), "generation one");
    write_entry(&fake, "fakeTelo: { stdout: [generation two, again] }\n");
    let entry = entry_path(&fake);
    expect_reload_of(&mut fake, &entry);
    assert_eq!(fake.next_line(), "generation two");
    assert_eq!(fake.next_line(), "again");
}

#[test]
fn the_debug_stream_shows_each_generation_stopping_and_starting_in_order() {
    let mut fake = launch("fakeTelo: { stdout: [one], listen: [0] }\n")
        .args(WATCH_INSPECT)
        .spawn();
    let address = fake.line_after("inspect listening on ");
    let first_port: u16 = fake.line_after("listening on ").parse().unwrap();
    let (_, mut events) = open_events(&address);
    let boot = next_frame(&mut events);
    assert_eq!(boot["kind"], "log");
    let (names, resolved) = events_until(&mut events, "Kernel.PortsResolved");
    assert_eq!(
        names,
        ["Kernel.Blocked", "Kernel.Starting", "Kernel.PortsResolved"]
    );
    assert_eq!(resolved["payload"]["ports"][0]["port"], first_port);
    let (_, started) = events_until(&mut events, "Kernel.Started");
    assert_eq!(started["payload"], json!({}));

    write_entry(
        &fake,
        "fakeTelo:\n  stdout: [two]\n  debugEvents: [Custom.Event]\n",
    );
    assert_eq!(fake.line_after("two"), "");
    let (names, stopped) = events_until(&mut events, "Kernel.Stopped");
    assert_eq!(names, ["Kernel.Stopping", "Kernel.Stopped"]);
    assert_eq!(stopped["payload"], json!({ "exitCode": 0 }));
    let (names, _) = events_until(&mut events, "Custom.Event");
    assert_eq!(
        names,
        [
            "Kernel.Blocked",
            "Kernel.Starting",
            "Kernel.PortsResolved",
            "Kernel.Started",
            "Custom.Event"
        ]
    );

    // A late subscriber replays from the start of the process.
    let (_, mut late) = open_events(&address);
    assert_eq!(next_frame(&mut late)["kind"], "log");
    let (names, _) = events_until(&mut late, "Custom.Event");
    assert_eq!(names.iter().filter(|n| *n == "Kernel.Started").count(), 2);
}

#[test]
fn ports_resolved_lists_the_generations_listen_ports() {
    let mut fake = launch("fakeTelo: { listen: [0, 0] }\n")
        .args(WATCH_INSPECT)
        .spawn();
    let address = fake.line_after("inspect listening on ");
    let first: u16 = fake.line_after("listening on ").parse().unwrap();
    let second: u16 = fake.line_after("listening on ").parse().unwrap();
    let (_, mut events) = open_events(&address);
    let (_, resolved) = events_until(&mut events, "Kernel.PortsResolved");
    assert_eq!(
        resolved["payload"],
        json!({ "ports": [
            { "name": "listen-0", "port": first, "protocol": "tcp" },
            { "name": "listen-1", "port": second, "protocol": "tcp" },
        ] })
    );
    write_entry(&fake, "fakeTelo: { stdout: [no ports] }\n");
    fake.line_after("no ports");
    events_until(&mut events, "Kernel.Stopped");
    let (_, resolved) = events_until(&mut events, "Kernel.PortsResolved");
    assert_eq!(resolved["payload"], json!({ "ports": [] }));
}

/// A port added while the app is edited is announced by the generation that
/// binds it: what a runner publishes live.
#[test]
fn a_reload_that_adds_a_port_resolves_it() {
    let mut fake = launch("fakeTelo: { stdout: [no ports yet] }\n")
        .args(WATCH_INSPECT)
        .spawn();
    let address = fake.line_after("inspect listening on ");
    fake.line_after("no ports yet");
    let (_, mut events) = open_events(&address);
    let (_, resolved) = events_until(&mut events, "Kernel.PortsResolved");
    assert_eq!(resolved["payload"], json!({ "ports": [] }));
    write_entry(&fake, "fakeTelo: { listen: [0] }\n");
    let port: u16 = fake.line_after("listening on ").parse().unwrap();
    let (_, resolved) = events_until(&mut events, "Kernel.PortsResolved");
    assert_eq!(
        resolved["payload"],
        json!({ "ports": [{ "name": "listen-0", "port": port, "protocol": "tcp" }] })
    );
}

#[test]
fn a_change_set_of_five_files_makes_exactly_one_reload() {
    let mut fake = launch("fakeTelo: { stdout: [generation one] }\n")
        .args(WATCH)
        .spawn();
    assert_eq!(fake.line_after("generation "), "one");
    write_entry(&fake, "fakeTelo: { stdout: [generation two] }\n");
    for name in ["a.txt", "b.txt", "c.txt", "d.txt"] {
        std::fs::write(fake.dir().join(name), name).expect("write a file");
    }
    assert!(fake.next_line().starts_with("[watch] change detected in "));
    assert_eq!(fake.next_line(), "[watch] reloading...");
    assert_eq!(fake.next_line(), "[watch] watching 5 file(s)");
    assert_eq!(fake.next_line(), "generation two");
    // A second reload from the same change set would come before this one's
    // lines and show "generation two" again.
    write_entry(&fake, "fakeTelo: { stdout: [generation three] }\n");
    let entry = entry_path(&fake);
    expect_reload_of(&mut fake, &entry);
    assert_eq!(fake.next_line(), "generation three");
}

#[test]
fn changes_under_ignored_directories_do_not_reload() {
    let mut fake = launch("fakeTelo: { stdout: [generation one] }\n")
        .args(WATCH)
        .spawn();
    assert_eq!(fake.line_after("generation "), "one");
    for dir in [".telo", "node_modules", ".git"] {
        std::fs::create_dir_all(fake.dir().join(dir).join("deep")).unwrap();
        std::fs::write(fake.dir().join(dir).join("deep/file"), "x").unwrap();
    }
    // The next reload is the entry's own, not one for the ignored files.
    write_entry(&fake, "fakeTelo: { stdout: [generation two] }\n");
    let entry = entry_path(&fake);
    expect_reload_of(&mut fake, &entry);
    assert_eq!(fake.next_line(), "generation two");
}

#[test]
fn a_broken_manifest_fails_the_generation_and_a_fix_starts_the_next() {
    let mut fake = launch("fakeTelo: { stdout: [good one] }\n")
        .args(WATCH_INSPECT)
        .spawn();
    let address = fake.line_after("inspect listening on ");
    fake.line_after("good one");
    let (_, mut events) = open_events(&address);
    events_until(&mut events, "Kernel.Started");

    write_entry(&fake, "fakeTelo: [unclosed\n");
    let (names, failed) = events_until(&mut events, "Kernel.RunFailed");
    assert_eq!(
        names,
        [
            "Kernel.Stopping",
            "Kernel.Stopped",
            "Kernel.Blocked",
            "Kernel.RunFailed"
        ]
    );
    assert_eq!(failed["payload"]["phase"], "load");
    let message = failed["payload"]["message"].as_str().expect("a message");
    assert!(message.contains("not valid YAML"), "{message}");

    write_entry(&fake, "fakeTelo: { stdout: [good again] }\n");
    fake.line_after("good again");
    // Nothing ran in the failed generation, so nothing stops.
    let (names, _) = events_until(&mut events, "Kernel.Started");
    assert_eq!(
        names,
        [
            "Kernel.Blocked",
            "Kernel.Starting",
            "Kernel.PortsResolved",
            "Kernel.Started"
        ]
    );
}

/// Connects until the port refuses, within the output deadline.
fn wait_until_closed(port: u16) {
    let deadline = Instant::now() + OUTPUT_TIMEOUT;
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(Instant::now() < deadline, "port {port} never closed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_one_shot_generation_ends_without_ending_the_process() {
    let mut fake = launch("fakeTelo: { listen: [0], exitAfterMs: 50, exitCode: 3 }\n")
        .args(WATCH_INSPECT)
        .spawn();
    let address = fake.line_after("inspect listening on ");
    let port: u16 = fake.line_after("listening on ").parse().unwrap();
    // The generation's end closes its port; the process stays.
    wait_until_closed(port);
    let (_, mut events) = open_events(&address);
    events_until(&mut events, "Kernel.Started");
    write_entry(&fake, "fakeTelo: { stdout: [generation two] }\n");
    assert_eq!(fake.line_after("generation "), "two");
    let (names, stopped) = events_until(&mut events, "Kernel.Stopped");
    assert_eq!(names, ["Kernel.Stopping", "Kernel.Stopped"]);
    assert_eq!(stopped["payload"], json!({ "exitCode": 3 }));
    events_until(&mut events, "Kernel.Started");
}

#[test]
fn listen_ports_follow_the_manifest() {
    let fixed = {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let mut fake = launch(&format!("fakeTelo: {{ listen: [{fixed}, 0] }}\n"))
        .args(WATCH)
        .spawn();
    assert_eq!(fake.line_after("listening on "), fixed.to_string());
    let dropped: u16 = fake.line_after("listening on ").parse().unwrap();
    assert_eq!(
        http_get(&format!("127.0.0.1:{dropped}"), "/").1,
        format!("ok {dropped}")
    );

    // The same fixed port again (closed first, then bound anew) and a new one.
    write_entry(
        &fake,
        &format!("fakeTelo: {{ stdout: [two], listen: [{fixed}, 0] }}\n"),
    );
    assert_eq!(fake.line_after("two"), "");
    assert_eq!(fake.next_line(), format!("listening on {fixed}"));
    let added: u16 = fake.line_after("listening on ").parse().unwrap();
    for port in [fixed, added] {
        assert_eq!(
            http_get(&format!("127.0.0.1:{port}"), "/").1,
            format!("ok {port}")
        );
    }
    if dropped != added {
        assert!(
            TcpStream::connect(("127.0.0.1", dropped)).is_err(),
            "the previous generation's port {dropped} is still open"
        );
    }

    write_entry(&fake, "fakeTelo: { stdout: [three] }\n");
    assert_eq!(fake.line_after("three"), "");
    wait_until_closed(fixed);
}

#[test]
fn sigterm_stops_the_generation_and_exits_zero() {
    let mut fake = launch("fakeTelo: { stdout: [up], listen: [0], exitCode: 5 }\n")
        .args(WATCH_INSPECT)
        .spawn();
    let address = fake.line_after("inspect listening on ");
    fake.line_after("listening on ");
    let (_, mut events) = open_events(&address);
    events_until(&mut events, "Kernel.Started");
    kill_process(Pid::from_child(fake.child()), Signal::TERM).unwrap();
    let (names, stopped) = events_until(&mut events, "Kernel.Stopped");
    assert_eq!(names, ["Kernel.Stopping", "Kernel.Stopped"]);
    assert_eq!(stopped["payload"], json!({ "exitCode": 0 }));
    let (status, rest) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(rest, "\n[watch] stopping...\n");
}

#[test]
fn echo_ends_its_generation_and_the_next_one_echoes_again() {
    let mut fake = launch("fakeTelo: { stdout: [one], listen: [0], echo: true, exitCode: 2 }\n")
        .args(WATCH_INSPECT)
        .spawn();
    let address = fake.line_after("inspect listening on ");
    assert_eq!(fake.line_after("one"), "");
    let port: u16 = fake.line_after("listening on ").parse().unwrap();
    fake.write_stdin("hello\n");
    assert_eq!(fake.next_line(), "hello");
    fake.write_stdin("exit\n");
    // The generation's end closes its port.
    wait_until_closed(port);
    let (_, mut events) = open_events(&address);
    events_until(&mut events, "Kernel.Started");
    write_entry(&fake, "fakeTelo: { stdout: [two], echo: true }\n");
    assert_eq!(fake.line_after("two"), "");
    // `exit` ended generation one with its exitCode, not the process.
    let (_, stopped) = events_until(&mut events, "Kernel.Stopped");
    assert_eq!(stopped["payload"], json!({ "exitCode": 2 }));
    fake.write_stdin("again\n");
    assert_eq!(fake.next_line(), "again");
}

#[test]
fn ignore_sigterm_holds_under_watch_and_sigint_prints_the_stop_line() {
    let mut fake = launch("fakeTelo: { stdout: [one], ignoreSigterm: true, stopLine: bye }\n")
        .args(WATCH)
        .spawn();
    assert_eq!(fake.line_after("one"), "");
    kill_process(Pid::from_child(fake.child()), Signal::TERM).unwrap();
    // Still watching after SIGTERM: an edit makes the next generation.
    write_entry(
        &fake,
        "fakeTelo: { stdout: [two], ignoreSigterm: true, stopLine: bye }\n",
    );
    assert_eq!(fake.line_after("two"), "");
    kill_process(Pid::from_child(fake.child()), Signal::INT).unwrap();
    let (status, rest) = fake.wait_for_exit();
    assert_eq!(status.code(), Some(0));
    assert_eq!(rest, "\n[watch] stopping...\nbye\n");
}
