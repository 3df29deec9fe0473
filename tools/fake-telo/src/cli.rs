//! The command line of the `telo` CLI, as far as the runners use it:
//! `telo run [--inspect ADDR] [--no-open] [--watch] <entry>`, and
//! `telo install <paths..>` (the warm-up of a warm pod's kernel cache).

use std::ffi::OsString;

pub const USAGE: &str = "usage: fake-telo run [--inspect HOST:PORT] [--no-open] [--watch] <entry>\n       fake-telo install <paths..>\n       fake-telo --version";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(RunOptions),
    /// `install <paths..>`: manifests (or directories holding `telo.yaml`).
    Install(Vec<String>),
    Version,
    Help,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// The entry manifest exactly as given (relative to the working directory or absolute).
    pub entry: String,
    pub inspect: Option<InspectAddr>,
    /// Accepted for compatibility; fake-telo never opens a browser.
    pub no_open: bool,
    /// Watch mode: generations that reload when a file under the entry's
    /// directory changes, as the real kernel's `--watch` (see `watch`).
    pub watch: bool,
}

/// Where `--inspect` asks the debug event stream to be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectAddr {
    pub host: String,
    pub port: u16,
}

/// Node's inspector (which `telo --inspect` mirrors) binds loopback when only a port is given.
const INSPECT_DEFAULT_HOST: &str = "127.0.0.1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UsageError {
    #[error("missing command")]
    MissingCommand,
    #[error("argument is not valid UTF-8: {0:?}")]
    NotUtf8(OsString),
    #[error("unknown option '{0}'")]
    UnknownOption(String),
    #[error("option '{0}' needs a value")]
    MissingValue(String),
    #[error("option '{option}' takes no value, got '{value}'")]
    UnexpectedValue { option: String, value: String },
    #[error("--inspect expects HOST:PORT (or PORT), got '{0}'")]
    InvalidInspectAddr(String),
    #[error("missing <entry>")]
    MissingEntry,
    #[error("unexpected argument '{extra}' (the entry is already '{entry}')")]
    ExtraArgument { entry: String, extra: String },
}

/// Parses the arguments after the program name.
///
/// `run` may be omitted (`fake-telo <entry> --inspect …`): the docker backend
/// launches `telo ./<entry> …` without it, and a stand-in that rejected that
/// form would make those launches fail for the wrong reason.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let args = args
        .into_iter()
        .map(|arg| arg.into_string().map_err(UsageError::NotUtf8))
        .collect::<Result<Vec<_>, _>>()?;
    match args.first().map(String::as_str) {
        None => Err(UsageError::MissingCommand),
        Some("--version" | "-V") => Ok(Command::Version),
        Some("--help" | "-h") => Ok(Command::Help),
        Some("run") => parse_run(&args[1..]).map(Command::Run),
        Some("install") => parse_install(&args[1..]).map(Command::Install),
        Some(_) => parse_run(&args).map(Command::Run),
    }
}

fn parse_run(args: &[String]) -> Result<RunOptions, UsageError> {
    let mut entry: Option<String> = None;
    let mut inspect = None;
    let mut no_open = false;
    let mut watch = false;
    let mut only_positionals = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let positional = if only_positionals || !arg.starts_with('-') || arg == "-" {
            arg.clone()
        } else {
            let (option, inline_value) = match arg.split_once('=') {
                Some((option, value)) => (option, Some(value)),
                None => (arg.as_str(), None),
            };
            match option {
                "--" => only_positionals = true,
                "--inspect" => {
                    let value = match inline_value {
                        Some(value) => value,
                        None => rest
                            .next()
                            .map(String::as_str)
                            .ok_or_else(|| UsageError::MissingValue(option.to_owned()))?,
                    };
                    inspect = Some(parse_inspect_addr(value)?);
                }
                "--no-open" | "--watch" => {
                    if let Some(value) = inline_value {
                        return Err(UsageError::UnexpectedValue {
                            option: option.to_owned(),
                            value: value.to_owned(),
                        });
                    }
                    if option == "--watch" {
                        watch = true;
                    } else {
                        no_open = true;
                    }
                }
                _ => return Err(UsageError::UnknownOption(arg.clone())),
            }
            continue;
        };
        if let Some(entry) = &entry {
            return Err(UsageError::ExtraArgument {
                entry: entry.clone(),
                extra: positional,
            });
        }
        entry = Some(positional);
    }
    Ok(RunOptions {
        entry: entry.ok_or(UsageError::MissingEntry)?,
        inspect,
        no_open,
        watch,
    })
}

/// `install`'s paths: at least one, no options.
fn parse_install(args: &[String]) -> Result<Vec<String>, UsageError> {
    if let Some(option) = args.iter().find(|arg| arg.starts_with('-') && *arg != "-") {
        return Err(UsageError::UnknownOption(option.clone()));
    }
    if args.is_empty() {
        return Err(UsageError::MissingEntry);
    }
    Ok(args.to_vec())
}

/// Accepts `HOST:PORT`, `[IPv6]:PORT` and a bare `PORT`.
fn parse_inspect_addr(value: &str) -> Result<InspectAddr, UsageError> {
    let invalid = || UsageError::InvalidInspectAddr(value.to_owned());
    let (host, port) = match value.rsplit_once(':') {
        Some((host, port)) => {
            let host = host
                .strip_prefix('[')
                .and_then(|host| host.strip_suffix(']'))
                .unwrap_or(host);
            if host.is_empty() || host.contains(['[', ']']) {
                return Err(invalid());
            }
            (host, port)
        }
        None => (INSPECT_DEFAULT_HOST, value),
    };
    let port = port.parse::<u16>().map_err(|_| invalid())?;
    Ok(InspectAddr {
        host: host.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    fn run(entry: &str, inspect: Option<(&str, u16)>, no_open: bool, watch: bool) -> Command {
        Command::Run(RunOptions {
            entry: entry.to_owned(),
            inspect: inspect.map(|(host, port)| InspectAddr {
                host: host.to_owned(),
                port,
            }),
            no_open,
            watch,
        })
    }

    #[test]
    fn options_are_accepted_before_and_after_the_entry() {
        let cases: &[(&[&str], Command)] = &[
            (&["run", "app.yaml"], run("app.yaml", None, false, false)),
            (
                &["run", "--inspect", "0.0.0.0:9230", "--no-open", "app.yaml"],
                run("app.yaml", Some(("0.0.0.0", 9230)), true, false),
            ),
            (
                &["run", "app.yaml", "--inspect", "0.0.0.0:9230", "--no-open"],
                run("app.yaml", Some(("0.0.0.0", 9230)), true, false),
            ),
            (
                &["run", "--watch", "--inspect=127.0.0.1:0", "/app/x.yaml"],
                run("/app/x.yaml", Some(("127.0.0.1", 0)), false, true),
            ),
            (
                &["run", "--", "--odd-name.yaml"],
                run("--odd-name.yaml", None, false, false),
            ),
        ];
        for (args, expected) in cases {
            assert_eq!(parse_strs(args).as_ref(), Ok(expected), "args {args:?}");
        }
    }

    #[test]
    fn run_may_be_omitted_as_the_docker_backend_does() {
        assert_eq!(
            parse_strs(&["./app.yaml", "--inspect", "0.0.0.0:9230", "--no-open"]),
            Ok(run("./app.yaml", Some(("0.0.0.0", 9230)), true, false))
        );
    }

    #[test]
    fn inspect_addresses_take_ipv6_brackets_and_bare_ports() {
        assert_eq!(
            parse_inspect_addr("[::1]:9230"),
            Ok(InspectAddr {
                host: "::1".to_owned(),
                port: 9230
            })
        );
        assert_eq!(
            parse_inspect_addr("9230"),
            Ok(InspectAddr {
                host: "127.0.0.1".to_owned(),
                port: 9230
            })
        );
        for bad in ["", ":9230", "host:", "host:70000", "host:http", "[::1:9230"] {
            assert_eq!(
                parse_inspect_addr(bad),
                Err(UsageError::InvalidInspectAddr(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn misuse_is_reported_as_a_usage_error() {
        let cases: &[(&[&str], UsageError)] = &[
            (&[], UsageError::MissingCommand),
            (&["run"], UsageError::MissingEntry),
            (
                &["run", "--verbose", "a.yaml"],
                UsageError::UnknownOption("--verbose".to_owned()),
            ),
            (
                &["run", "a.yaml", "--inspect"],
                UsageError::MissingValue("--inspect".to_owned()),
            ),
            (
                &["run", "--watch=yes", "a.yaml"],
                UsageError::UnexpectedValue {
                    option: "--watch".to_owned(),
                    value: "yes".to_owned(),
                },
            ),
            (
                &["run", "a.yaml", "b.yaml"],
                UsageError::ExtraArgument {
                    entry: "a.yaml".to_owned(),
                    extra: "b.yaml".to_owned(),
                },
            ),
            (
                &["--bogus"],
                UsageError::UnknownOption("--bogus".to_owned()),
            ),
        ];
        for (args, expected) in cases {
            assert_eq!(parse_strs(args).as_ref(), Err(expected), "args {args:?}");
        }
    }

    #[test]
    fn install_takes_one_or_more_paths() {
        assert_eq!(
            parse_strs(&["install", "a.yaml", "dir"]),
            Ok(Command::Install(vec![
                "a.yaml".to_owned(),
                "dir".to_owned()
            ]))
        );
        assert_eq!(parse_strs(&["install"]), Err(UsageError::MissingEntry));
        assert_eq!(
            parse_strs(&["install", "--watch", "a.yaml"]),
            Err(UsageError::UnknownOption("--watch".to_owned()))
        );
    }

    #[test]
    fn version_and_help_are_recognised() {
        assert_eq!(parse_strs(&["--version"]), Ok(Command::Version));
        assert_eq!(parse_strs(&["-h"]), Ok(Command::Help));
    }
}
