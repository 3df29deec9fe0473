//! Runs a scripted workload: the start output in the documented order, then
//! the run loops until the lifetime rule (see `lifetime`) says it is over.
//! Under `--watch` the run is a series of generations instead (see `watch`).

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, BufRead};
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cli::RunOptions;
use crate::controllers;
use crate::debug_stream;
use crate::lifetime::{Ending, Lifetime};
use crate::listen;
use crate::modules;
use crate::net::{self, BindError};
use crate::output;
use crate::script::{self, Script, ScriptError};
use crate::signals;
use crate::terminal;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot read entry '{entry}'")]
    ReadEntry {
        entry: String,
        #[source]
        source: io::Error,
    },
    #[error("invalid entry '{entry}'")]
    ParseEntry {
        entry: String,
        #[source]
        source: ScriptError,
    },
    #[error("cannot load entry '{entry}'")]
    Modules {
        entry: String,
        #[source]
        source: modules::AnalysisError,
    },
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Cache(#[from] controllers::CacheError),
    #[error("cannot start {what}")]
    Start {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The line echo treats as "end the run" (after trimming the line ending).
pub const ECHO_EXIT_LINE: &[u8] = b"exit";

/// Runs the entry once and returns the exit code of a normal end.
pub fn run(options: &RunOptions) -> Result<u8, RunError> {
    let Some(script) = load_script(&options.entry)? else {
        controllers::load(
            std::path::Path::new(&options.entry),
            &module_controllers(&options.entry)?.used,
        )?;
        output::stdout_line(&format!("fake-telo: ran {}", options.entry));
        return Ok(0);
    };
    signals::install(&script).map_err(|source| RunError::Start {
        what: "the signal handlers",
        source,
    })?;
    if script.wait_for_input {
        wait_for_line();
    }
    start(&script, options)?;
    match Lifetime::of(&script) {
        Lifetime::Batch => {}
        Lifetime::Running {
            exit_after,
            echo_ends,
            last_line_ends,
        } => {
            // Every normal ending exits with `exitCode`; which one fired does not matter.
            run_loops(&script, exit_after, echo_ends, last_line_ends)?;
        }
    }
    Ok(script.exit_code)
}

/// What the entry imports and uses of the standard modules.
pub fn module_controllers(entry: &str) -> Result<modules::Analysis, RunError> {
    let manifest = fs::read_to_string(entry).map_err(|source| RunError::ReadEntry {
        entry: entry.to_owned(),
        source,
    })?;
    let base = std::path::Path::new(entry)
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    modules::analyse(&manifest, base).map_err(|source| RunError::Modules {
        entry: entry.to_owned(),
        source,
    })
}

/// `install <paths..>`, as the real kernel's: every `pkg:npm` controller
/// of every module the manifests import is installed into the kernel
/// cache; a source-built one cannot be fetched ("bundle not found": it is
/// built at run time), is reported and makes the exit 1. Then a summary
/// line, `<n> failed, <m> installed in <x.x>s`.
pub fn install(paths: &[String]) -> Result<u8, RunError> {
    let started = Instant::now();
    let (mut failed, mut installed) = (0_usize, 0_usize);
    for path in paths {
        let entry = modules::entry_file(path);
        let entry_text = entry.to_string_lossy().into_owned();
        for controller in module_controllers(&entry_text)?.imported {
            if controller.work == controllers::Work::NpmInstall {
                controllers::load(&entry, std::slice::from_ref(&controller))?;
                installed += 1;
            } else {
                output::stdout_line(&format!("  ✗  {}", controller.purl));
                output::stdout_line("       pkg:telo controller bundle not found");
                failed += 1;
            }
        }
    }
    output::stdout_line(&format!(
        "{failed} failed, {installed} installed in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    Ok(u8::from(failed > 0))
}

/// Reads the entry and finds its script; `None` for a manifest without one.
pub fn load_script(entry: &str) -> Result<Option<Script>, RunError> {
    let manifest = fs::read_to_string(entry).map_err(|source| RunError::ReadEntry {
        entry: entry.to_owned(),
        source,
    })?;
    script::find_script(&manifest).map_err(|source| RunError::ParseEntry {
        entry: entry.to_owned(),
        source,
    })
}

/// The scripted lines a run (or a watch generation) prints first: stdout,
/// raw stdout bytes, stderr, then the `printEnv` lines.
pub(crate) fn print_start_lines(script: &Script) {
    for line in &script.stdout {
        output::stdout_line(line);
    }
    for hex in &script.stdout_hex {
        output::stdout_bytes(&script::decode_hex(hex).unwrap_or_default());
    }
    for line in &script.stderr {
        output::stderr_line(line);
    }
    for name in &script.print_env {
        output::stdout_line(&env_line(name, env::var_os(name).as_deref()));
    }
    for address in &script.dial {
        output::stdout_line(&dial_line(address));
    }
}

/// How long one `dial` attempt may take.
const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Tries `address` once: `dial <address>: open`, or why not.
fn dial_line(address: &str) -> String {
    use std::net::ToSocketAddrs as _;
    let outcome = match address.to_socket_addrs().map(|mut all| all.next()) {
        Ok(Some(resolved)) => match std::net::TcpStream::connect_timeout(&resolved, DIAL_TIMEOUT) {
            Ok(_) => "open".to_owned(),
            Err(err) => format!("closed ({:?})", err.kind()),
        },
        Ok(None) => "closed (no address)".to_owned(),
        Err(err) => format!("closed ({:?})", err.kind()),
    };
    format!("dial {address}: {outcome}")
}

/// The start output, in the order the README documents.
fn start(script: &Script, options: &RunOptions) -> Result<(), RunError> {
    let mut loaded = script.controllers.clone();
    for controller in module_controllers(&options.entry)?.used {
        if !loaded.iter().any(|c| c.purl == controller.purl) {
            loaded.push(controller);
        }
    }
    controllers::load(std::path::Path::new(&options.entry), &loaded)?;
    if let Some(ms) = script.start_ms {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    print_start_lines(script);
    if script.print_size {
        terminal::print_size_and_follow_resizes().map_err(|source| RunError::Start {
            what: "the resize watcher",
            source,
        })?;
    }
    let env_host = env::var(net::HOST_VAR).ok();
    let listen_host = net::listen_host(env_host.as_deref());
    for &port in &script.listen {
        let listener = net::bind(listen_host, port)?;
        let port = listen::serve_ok(listener).map_err(|source| RunError::Start {
            what: "a listener",
            source,
        })?;
        output::stdout_line(&format!("listening on {port}"));
    }
    if let Some(requested) = &options.inspect {
        let host = net::inspect_host(requested, env_host.as_deref());
        let listener = net::bind(host, requested.port)?;
        let start_error = |source| RunError::Start {
            what: "the inspect server",
            source,
        };
        let address = listener.local_addr().map_err(start_error)?;
        let events = if script.debug_events.is_empty() {
            script::default_debug_events()
        } else {
            script.debug_events.clone()
        };
        debug_stream::serve(listener, events).map_err(start_error)?;
        output::stdout_line(&format!("inspect listening on {address}"));
    }
    if script.spew_bytes > 0 {
        output::spew(script.spew_bytes);
    }
    Ok(())
}

/// Blocks until one line (or end of input) arrives on stdin.
fn wait_for_line() {
    let mut line = Vec::new();
    let _ = io::stdin().lock().read_until(b'\n', &mut line);
}

pub fn env_line(name: &str, value: Option<&OsStr>) -> String {
    match value {
        Some(value) => format!("{name}={}", value.to_string_lossy()),
        None => format!("{name}=<unset>"),
    }
}

/// Starts the armed run loops and blocks until the first ending arrives.
/// With no ending armed it blocks until the process is killed.
fn run_loops(
    script: &Script,
    exit_after: Option<Duration>,
    echo_ends: bool,
    last_line_ends: bool,
) -> Result<Ending, RunError> {
    let (endings, ending) = mpsc::channel();
    if let Some(delay) = exit_after {
        let endings = endings.clone();
        spawn("exit-timer", move || {
            thread::sleep(delay);
            let _ = endings.send(Ending::ExitAfterElapsed);
        })?;
    }
    if echo_ends {
        let endings = endings.clone();
        let to_stderr = script.echo_stderr;
        spawn("echo", move || echo_stdin(&endings, to_stderr))?;
    }
    if let Some(every_ms) = script.line_every_ms {
        let count = script.lines;
        let padding = script.line_padding;
        let endings = last_line_ends.then(|| endings.clone());
        spawn("lines", move || {
            print_periodic_lines(every_ms, count, padding);
            if let Some(endings) = endings {
                let _ = endings.send(Ending::LastLinePrinted);
            }
        })?;
    }
    // `endings` is still alive here, so this waits for a real ending and
    // never mistakes "every loop finished" for one.
    let first = ending.recv().map_err(|_| RunError::Start {
        what: "the run loops",
        source: io::Error::other("every ending source vanished"),
    })?;
    drop(endings);
    Ok(first)
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> Result<(), RunError> {
    thread::Builder::new()
        .name(name.to_owned())
        .spawn(body)
        .map(drop)
        .map_err(|source| RunError::Start {
            what: "a run loop",
            source,
        })
}

/// Copies stdin to stdout (and, with `to_stderr`, stderr) a line at a time
/// until a line `exit` or EOF.
fn echo_stdin(endings: &Sender<Ending>, to_stderr: bool) {
    let mut stdin = io::stdin().lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        match stdin.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => {
                let _ = endings.send(Ending::EchoStdinClosed);
                return;
            }
            Ok(_) => {
                if trim_line_ending(&line) == ECHO_EXIT_LINE {
                    let _ = endings.send(Ending::EchoReadExit);
                    return;
                }
                output::echo_line(&line, to_stderr);
            }
        }
    }
}

pub fn trim_line_ending(line: &[u8]) -> &[u8] {
    let end = line
        .iter()
        .rposition(|&byte| byte != b'\n' && byte != b'\r')
        .map_or(0, |last| last + 1);
    &line[..end]
}

/// Prints `line <i> <unix-millis>` every `every_ms`, `count` times (forever
/// when `None`), each followed by a space and `padding` dots when `padding`
/// is not 0. Deadlines are computed from the start, so a slow write does
/// not push every later line back.
fn print_periodic_lines(every_ms: u64, count: Option<u64>, padding: usize) {
    let started = Instant::now();
    let dots = if padding == 0 {
        String::new()
    } else {
        format!(" {}", ".".repeat(padding))
    };
    let mut index: u64 = 1;
    while count.is_none_or(|count| index <= count) {
        let due = started + Duration::from_millis(every_ms.saturating_mul(index));
        thread::sleep(due.saturating_duration_since(Instant::now()));
        output::stdout_line(&format!(
            "{}{dots}",
            periodic_line(index, SystemTime::now())
        ));
        index += 1;
    }
}

pub fn periodic_line(index: u64, at: SystemTime) -> String {
    let millis = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    format!("line {index} {millis}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_show_the_value_or_unset() {
        assert_eq!(env_line("FOO", Some(OsStr::new("bar"))), "FOO=bar");
        assert_eq!(env_line("FOO", Some(OsStr::new(""))), "FOO=");
        assert_eq!(env_line("FOO", None), "FOO=<unset>");
    }

    #[test]
    fn echo_recognises_exit_with_any_line_ending() {
        for line in [&b"exit\n"[..], b"exit\r\n", b"exit\r", b"exit"] {
            assert_eq!(trim_line_ending(line), ECHO_EXIT_LINE);
        }
        assert_eq!(trim_line_ending(b" exit\n"), b" exit");
        assert_eq!(trim_line_ending(b"\r\n"), b"");
    }

    #[test]
    fn periodic_lines_carry_index_and_unix_millis() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(periodic_line(7, at), "line 7 1700000000123");
    }
}
