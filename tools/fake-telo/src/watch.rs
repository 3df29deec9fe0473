//! `run --watch`: one process, one *generation* per load of the entry, as the
//! real kernel's watch mode. Each generation re-reads the entry, so a changed
//! `fakeTelo:` block takes effect; a change under the entry's directory stops
//! the generation (its ports close, its loops end) and starts the next. A
//! script that would exit ends only its generation; the process waits for the
//! next change, and SIGTERM/SIGINT end it with 0.
//!
//! Everything that changes a generation happens on the session thread, driven
//! by the events the watcher, the timers, stdin and the signals send it.

use std::env;
use std::io::{self, BufRead};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use signal_hook::consts::signal::SIGTERM;

use crate::cli::RunOptions;
use crate::debug_stream;
use crate::lifetime::Lifetime;
use crate::listen::{self, StoppableListener};
use crate::live_stream::Hub;
use crate::net;
use crate::output;
use crate::run::{self, ECHO_EXIT_LINE, RunError, periodic_line, trim_line_ending};
use crate::script::{DebugEvent, Script};
use crate::signals;
use crate::terminal;
use crate::watcher;

/// How long the last frames may take to reach the subscribers at exit.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

enum Event {
    /// A debounced change under the entry's directory.
    Changed(PathBuf),
    /// Generation `generation`'s script reached one of its endings.
    Ended {
        generation: u64,
    },
    StdinLine(Vec<u8>),
    StdinClosed,
    Signal(i32),
}

/// Where the current generation is.
enum State {
    /// `waitForInput`: the start output waits for a line on stdin.
    Waiting(Script),
    /// The script runs; `echo` is whether stdin lines are echoed.
    Running { script: Script, echo: bool },
    /// The script (or a manifest without one) has ended with this code.
    Ended {
        script: Option<Script>,
        exit_code: u8,
    },
    /// The entry could not be loaded or its ports not bound.
    Failed,
}

struct Session {
    entry: String,
    /// The watched directory (absolute).
    dir: PathBuf,
    hub: Option<Arc<Hub>>,
    events: Sender<Event>,
    generation: u64,
    state: State,
    listeners: Vec<StoppableListener>,
    /// Dropping these ends the generation's timer and periodic lines.
    cancels: Vec<Sender<()>>,
    stdin_reader: bool,
    stdin_closed: bool,
    /// Set while the current generation has `printSize`; `None` until one did.
    print_size: Option<Arc<AtomicBool>>,
}

/// Runs generations until SIGTERM or SIGINT, then returns 0.
pub fn run(options: &RunOptions) -> Result<u8, RunError> {
    let (events, inbox) = mpsc::channel();
    let signal_events = events.clone();
    signals::forward_stops(move |signal| {
        let _ = signal_events.send(Event::Signal(signal));
    })
    .map_err(start_error("the signal handlers"))?;
    let hub = match &options.inspect {
        Some(requested) => {
            let env_host = env::var(net::HOST_VAR).ok();
            let host = net::inspect_host(requested, env_host.as_deref());
            let listener = net::bind(host, requested.port)?;
            let address = listener
                .local_addr()
                .map_err(start_error("the inspect server"))?;
            let hub = Arc::new(Hub::new());
            debug_stream::serve_live(listener, Arc::clone(&hub))
                .map_err(start_error("the inspect server"))?;
            output::stdout_line(&format!("inspect listening on {address}"));
            Some(hub)
        }
        None => None,
    };
    let dir = entry_dir(&options.entry);
    let change_events = events.clone();
    let _watch = watcher::spawn(&dir, move |path| {
        let _ = change_events.send(Event::Changed(path));
    })
    .map_err(|error| RunError::Start {
        what: "the file watcher",
        source: io::Error::other(output::error_chain(&error)),
    })?;
    let mut session = Session {
        entry: options.entry.clone(),
        dir,
        hub,
        events,
        generation: 0,
        state: State::Failed,
        listeners: Vec::new(),
        cancels: Vec::new(),
        stdin_reader: false,
        stdin_closed: false,
        print_size: None,
    };
    session.start_generation();
    Ok(session.serve(&inbox))
}

fn start_error(what: &'static str) -> impl FnOnce(io::Error) -> RunError {
    move |source| RunError::Start { what, source }
}

/// The entry's directory, absolute (relative to the working directory).
fn entry_dir(entry: &str) -> PathBuf {
    let dir = match Path::new(entry).parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::path::absolute(&dir).unwrap_or(dir)
}

impl Session {
    fn serve(&mut self, inbox: &Receiver<Event>) -> u8 {
        // `self.events` keeps the channel open, so this never ends by itself.
        while let Ok(event) = inbox.recv() {
            match event {
                Event::Changed(path) => self.reload(&path),
                Event::Ended { generation } if generation == self.generation => self.script_ended(),
                Event::Ended { .. } => {}
                Event::StdinLine(line) => self.stdin_line(&line),
                Event::StdinClosed => {
                    self.stdin_closed = true;
                    match &self.state {
                        State::Waiting(_) => self.start_waiting_script(),
                        State::Running { echo: true, .. } => self.script_ended(),
                        _ => {}
                    }
                }
                Event::Signal(signal) => {
                    if signal == SIGTERM && self.script().is_some_and(|s| s.ignore_sigterm) {
                        continue;
                    }
                    return self.shut_down();
                }
            }
        }
        0
    }

    fn publish(&self, event: DebugEvent) {
        if let Some(hub) = &self.hub {
            hub.publish(&event);
        }
    }

    fn publish_with(&self, name: &str, payload: serde_json::Value) {
        self.publish(DebugEvent::WithPayload {
            event: name.to_owned(),
            payload,
        });
    }

    fn script(&self) -> Option<&Script> {
        match &self.state {
            State::Waiting(script) | State::Running { script, .. } => Some(script),
            State::Ended { script, .. } => script.as_ref(),
            State::Failed => None,
        }
    }

    fn reload(&mut self, path: &Path) {
        output::stdout_line(&format!("[watch] change detected in {}", path.display()));
        if !matches!(self.state, State::Failed) {
            self.stop_generation();
        }
        output::stdout_line("[watch] reloading...");
        self.start_generation();
    }

    /// `Kernel.Stopping`, the generation's resources closed, `Kernel.Stopped`.
    fn stop_generation(&mut self) {
        self.publish("Kernel.Stopping".into());
        self.release();
        let exit_code = match &self.state {
            State::Ended { exit_code, .. } => *exit_code,
            _ => 0,
        };
        self.publish_with("Kernel.Stopped", json!({ "exitCode": exit_code }));
    }

    /// Closes the current generation's ports and ends its loops.
    fn release(&mut self) {
        self.cancels.clear();
        for listener in self.listeners.drain(..) {
            listener.stop();
        }
        if let Some(active) = &self.print_size {
            active.store(false, Ordering::SeqCst);
        }
    }

    fn shut_down(&mut self) -> u8 {
        output::stdout_line("");
        output::stdout_line("[watch] stopping...");
        let stop_line = self.script().and_then(|script| script.stop_line.clone());
        self.stop_generation();
        if let Some(line) = stop_line {
            output::stdout_line(&line);
        }
        if let Some(hub) = &self.hub {
            hub.flush(FLUSH_TIMEOUT);
        }
        0
    }

    fn start_generation(&mut self) {
        self.generation += 1;
        self.publish_with(
            "Kernel.Blocked",
            json!({ "reason": "watch-mode", "count": 1 }),
        );
        let loaded = run::load_script(&self.entry);
        if loaded.is_ok() {
            // As the real kernel, once per generation that loaded.
            output::stdout_line(&format!(
                "[watch] watching {} file(s)",
                watcher::count_files(&self.dir)
            ));
        }
        match loaded {
            Err(error) => {
                self.fail("load", &error);
            }
            Ok(None) => {
                self.publish("Kernel.Starting".into());
                output::stdout_line(&format!("fake-telo: ran {}", self.entry));
                self.publish_with("Kernel.PortsResolved", json!({ "ports": [] }));
                self.publish("Kernel.Started".into());
                self.state = State::Ended {
                    script: None,
                    exit_code: 0,
                };
            }
            Ok(Some(script)) if script.wait_for_input && !self.stdin_closed => {
                self.read_stdin();
                self.state = State::Waiting(script);
            }
            Ok(Some(script)) => self.launch(script),
        }
    }

    fn fail(&mut self, phase: &str, error: &dyn std::error::Error) {
        let message = output::error_chain(error);
        output::stderr_line(&format!("fake-telo: {message}"));
        self.publish_with(
            "Kernel.RunFailed",
            json!({ "phase": phase, "message": message }),
        );
        self.state = State::Failed;
    }

    fn start_waiting_script(&mut self) {
        if let State::Waiting(script) = std::mem::replace(&mut self.state, State::Failed) {
            self.launch(script);
        }
    }

    /// The generation's start output, ports and loops (the README's start order).
    fn launch(&mut self, script: Script) {
        if let Err(error) =
            crate::controllers::load(std::path::Path::new(&self.entry), &script.controllers)
        {
            self.fail("load", &error);
            return;
        }
        if let Some(ms) = script.start_ms {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        self.publish("Kernel.Starting".into());
        run::print_start_lines(&script);
        if script.print_size {
            self.follow_size();
        }
        if let Err(error) = self.open_ports(&script) {
            self.release();
            self.fail("start", &error);
            return;
        }
        let ports: Vec<_> = self
            .listeners
            .iter()
            .enumerate()
            .map(|(index, listener)| {
                json!({ "name": format!("listen-{index}"), "port": listener.port(), "protocol": "tcp" })
            })
            .collect();
        self.publish_with("Kernel.PortsResolved", json!({ "ports": ports }));
        if script.spew_bytes > 0 {
            output::spew(script.spew_bytes);
        }
        self.publish("Kernel.Started".into());
        for event in &script.debug_events {
            self.publish(event.clone());
        }
        match Lifetime::of(&script) {
            Lifetime::Batch => {
                let exit_code = script.exit_code;
                self.state = State::Ended {
                    script: Some(script),
                    exit_code,
                };
            }
            Lifetime::Running {
                exit_after,
                echo_ends,
                last_line_ends,
            } => {
                if let Some(delay) = exit_after {
                    self.start_timer(delay);
                }
                if let Some(every_ms) = script.line_every_ms {
                    self.start_lines(every_ms, script.lines, last_line_ends);
                }
                if echo_ends {
                    self.read_stdin();
                }
                self.state = State::Running {
                    script,
                    echo: echo_ends,
                };
                if echo_ends && self.stdin_closed {
                    self.script_ended();
                }
            }
        }
    }

    fn open_ports(&mut self, script: &Script) -> Result<(), RunError> {
        let env_host = env::var(net::HOST_VAR).ok();
        let host = net::listen_host(env_host.as_deref());
        for &port in &script.listen {
            let listener = net::bind(host, port)?;
            let listener =
                listen::serve_ok_until_stopped(listener).map_err(|source| RunError::Start {
                    what: "a listener",
                    source,
                })?;
            output::stdout_line(&format!("listening on {}", listener.port()));
            self.listeners.push(listener);
        }
        Ok(())
    }

    fn follow_size(&mut self) {
        if self.print_size.is_none() {
            let active = Arc::new(AtomicBool::new(false));
            if terminal::follow_resizes_while(Arc::clone(&active)).is_ok() {
                self.print_size = Some(active);
            }
        }
        terminal::print_size();
        if let Some(active) = &self.print_size {
            active.store(true, Ordering::SeqCst);
        }
    }

    /// A cancel channel for one loop of this generation: the loop's wait ends
    /// early (disconnected) once the generation is released.
    fn cancel_token(&mut self) -> Receiver<()> {
        let (cancel, token) = mpsc::channel();
        self.cancels.push(cancel);
        token
    }

    fn start_timer(&mut self, delay: Duration) {
        let token = self.cancel_token();
        let events = self.events.clone();
        let generation = self.generation;
        spawn("exit-timer", move || {
            if let Err(RecvTimeoutError::Timeout) = token.recv_timeout(delay) {
                let _ = events.send(Event::Ended { generation });
            }
        });
    }

    fn start_lines(&mut self, every_ms: u64, count: Option<u64>, last_line_ends: bool) {
        let token = self.cancel_token();
        let events = self.events.clone();
        let generation = self.generation;
        spawn("lines", move || {
            let started = Instant::now();
            let mut index: u64 = 1;
            while count.is_none_or(|count| index <= count) {
                let due = started + Duration::from_millis(every_ms.saturating_mul(index));
                let wait = due.saturating_duration_since(Instant::now());
                if !matches!(token.recv_timeout(wait), Err(RecvTimeoutError::Timeout)) {
                    return;
                }
                output::stdout_line(&periodic_line(index, SystemTime::now()));
                index += 1;
            }
            if last_line_ends {
                let _ = events.send(Event::Ended { generation });
            }
        });
    }

    /// Starts the one stdin reader of the process (generations share stdin).
    fn read_stdin(&mut self) {
        if self.stdin_reader {
            return;
        }
        self.stdin_reader = true;
        let events = self.events.clone();
        spawn("stdin", move || {
            let mut stdin = io::stdin().lock();
            loop {
                let mut line = Vec::new();
                match stdin.read_until(b'\n', &mut line) {
                    Ok(1..) => {
                        if events.send(Event::StdinLine(line)).is_err() {
                            return;
                        }
                    }
                    Ok(0) | Err(_) => {
                        let _ = events.send(Event::StdinClosed);
                        return;
                    }
                }
            }
        });
    }

    fn stdin_line(&mut self, line: &[u8]) {
        match &self.state {
            State::Waiting(_) => self.start_waiting_script(),
            State::Running { echo: true, script } => {
                if trim_line_ending(line) == ECHO_EXIT_LINE {
                    self.script_ended();
                } else {
                    output::echo_line(line, script.echo_stderr);
                }
            }
            _ => {}
        }
    }

    /// The script reached an ending: only the generation ends. Its ports close
    /// and its loops stop; `Kernel.Stopped` waits for the next change.
    fn script_ended(&mut self) {
        if let State::Running { script, .. } = std::mem::replace(&mut self.state, State::Failed) {
            self.release();
            let exit_code = script.exit_code;
            self.state = State::Ended {
                script: Some(script),
                exit_code,
            };
        }
    }
}

/// A loop thread; one that cannot be spawned leaves its loop out, as the
/// machine is out of threads and the test will see the missing output.
fn spawn(name: &str, body: impl FnOnce() + Send + 'static) {
    let _ = thread::Builder::new().name(name.to_owned()).spawn(body);
}
