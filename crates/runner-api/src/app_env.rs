//! Which client variables an app session takes (our hardening; the reference
//! passes every client variable to the operator's app).
//!
//! An app session runs the operator's program beside the operator's secrets
//! (API keys in the catalog's `env`). Its client chooses only data, never
//! code, so two rules apply to the client's `env`:
//!
//! * **Never a loader or runtime variable.** Variables that make a program
//!   load other code (`NODE_OPTIONS`, `LD_PRELOAD`, `PYTHONPATH`, a Telo kernel's
//!   `TELO_REGISTRY_URL`, …), run
//!   shell code (`BASH_ENV`, `PS4`, exported functions), find a different
//!   program (`PATH`), trust another certificate or route its outbound calls
//!   through another host (`HTTPS_PROXY`, `SSL_CERT_FILE`, …) are refused with
//!   a 400 naming the variable, whatever the catalog says.
//! * **Only what the entry accepts, when it says.** A catalog entry with
//!   `acceptEnv: [..]` takes exactly those names from clients. App-specific
//!   redirections (an `OPENAI_BASE_URL` that sends the operator's key to the
//!   client's server) can only be ruled out by the app's operator, so entries
//!   holding secrets should declare it; without it every other name passes.
//!
//! Names compare case-insensitively: some programs read their settings that
//! way (npm, the proxy variables), and no legitimate name differs from a
//! refused one only in case.

/// Exact names refused for app sessions.
const REFUSED_NAMES: &[&str] = &[
    // Program lookup and per-user configuration.
    "PATH",
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    // Shell start-up and evaluation.
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "IFS",
    "CDPATH",
    "GLOBIGNORE",
    // Where a Telo kernel takes its modules from.
    "TELO_REGISTRY_URL",
    "TELO_CACHE_DIR",
    // Node.js.
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_REPL_EXTERNAL_MODULE",
    "NODE_EXTRA_CA_CERTS",
    "NODE_TLS_REJECT_UNAUTHORIZED",
    "NODE_ICU_DATA",
    "NODE_V8_COVERAGE",
    // The C library and dynamic loader (besides every `LD_*`).
    "GLIBC_TUNABLES",
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RESOLV_HOST_CONF",
    "MALLOC_CHECK_",
    // Other runtimes a program may start.
    "CLASSPATH",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    // TLS trust and engines.
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    // Where outbound requests go.
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "FTP_PROXY",
    "GLOBAL_AGENT_HTTP_PROXY",
];

/// Name prefixes refused for app sessions.
const REFUSED_PREFIXES: &[&str] = &[
    "LD_",
    "BASH_FUNC_",
    "NPM_CONFIG_",
    "PYTHON",
    "PERL",
    "RUBY",
    "GIT_",
    "DYLD_",
];

/// Why `name` is refused from an app session's client, if it is.
pub fn refused_client_variable(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    let refused = REFUSED_NAMES.contains(&upper.as_str())
        || REFUSED_PREFIXES
            .iter()
            .any(|prefix| upper.starts_with(prefix));
    refused.then_some("it changes how the operator's program loads or runs")
}

/// Whether an entry that accepts `accepted` takes `name` from a client.
pub fn accepts(accepted: &[String], name: &str) -> bool {
    accepted.iter().any(|accepted| accepted == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_and_runtime_variables_are_refused_in_any_case() {
        for name in [
            "NODE_OPTIONS",
            "node_options",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "ld_audit",
            "BASH_ENV",
            "BASH_FUNC_echo%%",
            "PATH",
            "npm_config_node_options",
            "NPM_CONFIG_SCRIPT_SHELL",
            "PYTHONSTARTUP",
            "PERL5OPT",
            "RUBYOPT",
            "GIT_SSH_COMMAND",
            "https_proxy",
            "GLIBC_TUNABLES",
            "JAVA_TOOL_OPTIONS",
            "TELO_REGISTRY_URL",
        ] {
            assert!(refused_client_variable(name).is_some(), "{name}");
        }
    }

    #[test]
    fn ordinary_variables_pass() {
        for name in ["MODE", "PROJECT_ID", "NODE_ENV", "LANG", "TZ"] {
            assert_eq!(refused_client_variable(name), None, "{name}");
        }
    }

    #[test]
    fn acceptance_is_by_exact_name() {
        let accepted = vec!["MODE".to_owned()];
        assert!(accepts(&accepted, "MODE"));
        assert!(!accepts(&accepted, "mode"));
        assert!(!accepts(&[], "MODE"));
    }
}
